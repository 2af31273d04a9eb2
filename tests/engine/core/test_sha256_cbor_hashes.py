"""vLLM's sha256_cbor block hashes (``prefix_caching_hash_algo="sha256_cbor"``), against
an implementation written here from vLLM's definition: a block's hash is the SHA-256 of
the canonical CBOR of (its parent's hash, the tuple of its token ids, its extra keys or
None), and a first block's parent is the sha256_cbor of PYTHONHASHSEED's value. A router
that computes a prompt's hashes so finds them in our prefix cache.
"""

from __future__ import annotations

import hashlib

import cbor2
import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.core.block_hashing import Sha256CborBlockHasher
from hetero_infer.engine.core.block_manager import BlockManager
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.lora import LoRARequest

from tests.engine.core.test_block_manager import make_seq, prefill
from tests.tiny_models import save_tiny_model

BLOCK_SIZE = 16


def vllm_sha256_cbor(value: object) -> bytes:
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def vllm_block_hashes(
    token_ids: list[int],
    seed: str,
    block_size: int,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """The hashes of the full blocks of ``token_ids`` as vLLM chains them, its extra
    keys a block's LoRA adapter's name, then (the first block's only) the cache_salt."""
    parent = vllm_sha256_cbor(seed)
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        extra = [lora_name] if lora_name else []
        if start == 0 and cache_salt:
            extra.append(cache_salt)
        block = tuple(token_ids[start : start + block_size])
        parent = vllm_sha256_cbor((parent, block, tuple(extra) or None))
        hashes.append(parent)
    return hashes


def as_ints(hashes: list[bytes]) -> list[int]:
    return [int.from_bytes(h, "big") for h in hashes]


def test_block_manager_chains_vllm_hashes():
    tokens = list(range(100, 140))
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, hasher=Sha256CborBlockHasher("0"))
    seq = make_seq("a", tokens)
    prefill(bm, seq)
    expected = as_ints(vllm_block_hashes(tokens, "0", BLOCK_SIZE))
    assert len(expected) == 2
    assert [bm.blocks[i].block_hash for i in seq.block_table[:2]] == expected
    assert bm.blocks[seq.block_table[2]].block_hash is None  # the partial block


@pytest.mark.parametrize(
    ("lora_name", "cache_salt"), [("sql", None), (None, "tenant-a"), ("sql", "tenant-a")]
)
def test_adapters_and_salts_take_vllms_extra_keys(lora_name, cache_salt):
    tokens = list(range(100, 150))
    bm = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, hasher=Sha256CborBlockHasher("0"))
    lora = LoRARequest(lora_name, 1, 2**40, "p") if lora_name else None
    params = SamplingParams(max_tokens=16, cache_salt=cache_salt)
    seq = Sequence("a", tokens, params, lora=lora)
    prefill(bm, seq)
    expected = as_ints(vllm_block_hashes(tokens, "0", BLOCK_SIZE, lora_name, cache_salt))
    assert len(expected) == 3
    assert [bm.blocks[i].block_hash for i in seq.block_table[:3]] == expected


def test_an_adapter_replaced_under_its_name_keeps_apart_from_the_one_before():
    """vLLM keys an adapter's blocks by its name alone: here a second adapter loaded
    under that name (load_inplace) is keyed by its fingerprint too."""
    tokens = list(range(100, 100 + BLOCK_SIZE))
    hasher = Sha256CborBlockHasher("0")
    first, second = (
        Sequence(f"s{i}", tokens, SamplingParams(), lora=LoRARequest("sql", 1, fp, "p"))
        for i, fp in enumerate((2**40, 2**41))
    )
    router = as_ints(vllm_block_hashes(tokens, "0", BLOCK_SIZE, "sql"))
    assert hasher.block_hashes(first, BLOCK_SIZE, 1) == router
    assert hasher.block_hashes(second, BLOCK_SIZE, 1) != router


def test_another_seed_gives_other_hashes():
    tokens = list(range(BLOCK_SIZE))
    zero, one = Sha256CborBlockHasher("0"), Sha256CborBlockHasher("1")
    assert zero.hash_block(None, tokens) != one.hash_block(None, tokens)
    # unset, as vLLM's: a random seed, which no one else can reproduce
    assert Sha256CborBlockHasher(None).none_hash != Sha256CborBlockHasher(None).none_hash


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return save_tiny_model("llama", tmp_path_factory.mktemp("llama"))


def test_the_engine_caches_the_blocks_a_router_computes(folder, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    config = EngineConfig(
        model=str(folder), block_size=BLOCK_SIZE, prefix_caching_hash_algo="sha256_cbor"
    )
    engine = LLMEngine(config)
    prompt = list(range(5, 5 + 2 * BLOCK_SIZE + 3))
    params = SamplingParams(max_tokens=20, temperature=0.0)
    out = engine.generate([prompt], params, use_tqdm=False)[0]
    tokens = prompt + out.token_ids
    block_manager = engine.core.scheduler.block_manager
    # the last token's KV is never computed: its block is full only with one more
    expected = as_ints(vllm_block_hashes(tokens[:-1], "0", BLOCK_SIZE))
    assert len(expected) == 3 and set(block_manager.cached_blocks) == set(expected)
    # the prompt again hits the cache (both full prompt blocks)
    hits = block_manager.prefix_hits
    again = engine.generate([prompt], params, use_tqdm=False)[0]
    assert again.token_ids == out.token_ids
    assert block_manager.prefix_hits - hits == 2 * BLOCK_SIZE


def test_a_cache_salt_keeps_its_own_blocks(folder, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    config = EngineConfig(
        model=str(folder), block_size=BLOCK_SIZE, prefix_caching_hash_algo="sha256_cbor"
    )
    engine = LLMEngine(config)
    prompt = list(range(5, 5 + 2 * BLOCK_SIZE))
    block_manager = engine.core.scheduler.block_manager
    engine.generate([prompt], SamplingParams(max_tokens=1), use_tqdm=False)
    hits = block_manager.prefix_hits
    salted = SamplingParams(max_tokens=1, cache_salt="tenant-a")
    engine.generate([prompt], salted, use_tqdm=False)
    assert block_manager.prefix_hits == hits
    engine.generate([prompt], salted, use_tqdm=False)  # the salt's own blocks, then hit
    assert block_manager.prefix_hits - hits == BLOCK_SIZE
