"""The Triton mixture-of-experts block (kernels/moe_triton.py) in Triton's interpreter:
the rows sorted and padded by expert, the grouped GEMM against each pair's own expert
product, and the block against the model's torch reference (engine/models/moe.py's
routing and experts), in fp32 and fp16."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hetero_infer.kernels.moe import MoeLayerSpec
from hetero_infer.kernels.moe_triton import (
    TritonMoe,
    align_by_expert,
    grouped_gemm,
    pack_moe_triton,
)

HIDDEN, WIDTH, EXPERTS, TOP_K = 64, 48, 6, 2


def randn(*shape: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_rows_are_sorted_by_expert_and_padded_to_whole_blocks():
    ids = torch.tensor([[3, 0], [3, 1], [0, 3]])
    rows, block_experts = align_by_expert(ids, num_experts=5, block_m=4)
    pad = ids.numel()
    assert block_experts.tolist() == [0, 1, 3]  # experts 2 and 4 chose no pair
    assert rows.tolist() == [1, 4, pad, pad, 3, pad, pad, pad, 0, 2, 5, pad]
    for block, expert in enumerate(block_experts.tolist()):
        pairs = [p for p in rows[4 * block : 4 * block + 4].tolist() if p < pad]
        assert all(ids.flatten()[p] == expert for p in pairs)


@pytest.mark.parametrize("gather_tokens", [True, False])
def test_grouped_gemm_is_each_pairs_expert_product(gather_tokens):
    tokens = 7
    ids = torch.stack(
        [
            torch.randperm(EXPERTS, generator=torch.Generator().manual_seed(t))[:TOP_K]
            for t in range(tokens)
        ]
    )
    w = randn(EXPERTS, 40, HIDDEN, seed=1)
    x = randn(tokens if gather_tokens else tokens * TOP_K, HIDDEN, seed=2)
    weights = torch.rand(tokens * TOP_K, generator=torch.Generator().manual_seed(3))
    rows, block_experts = align_by_expert(ids, EXPERTS, 16)
    out = grouped_gemm(x, w, rows, block_experts, tokens * TOP_K, TOP_K, gather_tokens, weights)
    for pair in range(tokens * TOP_K):
        src = pair // TOP_K if gather_tokens else pair
        expected = (w[ids.flatten()[pair]] @ x[src]) * weights[pair]
        torch.testing.assert_close(out[pair], expected, rtol=1e-5, atol=1e-5)


def reference(x, spec) -> torch.Tensor:
    """engine/models/moe.py's torch path: route, each expert over its tokens."""
    probs = torch.softmax(F.linear(x, spec.router).float(), dim=-1)
    weights, ids = torch.topk(probs, spec.top_k, dim=-1)
    if spec.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights.to(x.dtype)
    out = torch.zeros(x.shape, dtype=torch.float32)
    for t in range(x.shape[0]):
        for s in range(spec.top_k):
            e = ids[t, s]
            gate, up = (spec.gate_up[e].float() @ x[t].float()).chunk(2)
            out[t] += float(weights[t, s]) * (spec.down[e].float() @ (F.silu(gate) * up))
    if spec.shared is not None:
        gate_up, down, gate = spec.shared
        out += (torch.sigmoid(F.linear(x, gate)) * down(gate_up(x))).float()
    return out


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("shared", [False, True])
def test_the_block_matches_the_models_reference(dtype, tolerance, shared):
    shared_parts = None
    if shared:
        s_gate_up, s_down = (
            randn(64, HIDDEN, seed=5, dtype=dtype),
            randn(HIDDEN, 32, seed=6, dtype=dtype),
        )
        shared_parts = (
            lambda x: F.silu(F.linear(x, s_gate_up[:32])) * F.linear(x, s_gate_up[32:]),
            lambda h: F.linear(h, s_down),
            randn(1, HIDDEN, seed=7, dtype=dtype),
        )
    spec = MoeLayerSpec(
        router=randn(EXPERTS, HIDDEN, seed=8, dtype=dtype),
        gate_up=randn(EXPERTS, 2 * WIDTH, HIDDEN, seed=9, dtype=dtype) * 0.2,
        down=randn(EXPERTS, HIDDEN, WIDTH, seed=10, dtype=dtype) * 0.2,
        activation="silu",
        top_k=TOP_K,
        renormalize=True,
        shared=shared_parts,
    )
    moe = pack_moe_triton(spec)
    assert isinstance(moe, TritonMoe)
    x = randn(9, HIDDEN, seed=11, dtype=dtype)
    out = moe(x)
    assert out.dtype == dtype and out.shape == x.shape
    expected = reference(x, spec)
    scale = expected.abs().max().item()
    assert (out.float() - expected).abs().max().item() <= tolerance * scale


def test_quantized_experts_are_left_to_the_device():
    spec = MoeLayerSpec(torch.zeros(EXPERTS, HIDDEN), [], [], "silu", TOP_K, True)
    assert pack_moe_triton(spec) is None


def test_the_engine_on_the_triton_backend_gives_the_torch_backends_tokens(tmp_path):
    """A tiny OLMoE in fp32 through the Triton backend in the interpreter: its sparse
    layers bound to the grouped GEMM, greedy tokens as the torch backend's."""
    import random

    from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
    from hetero_infer.engine.models.moe import SparseMoe

    from tests.tiny_models import TINY_MODELS, save_tiny_model

    folder = save_tiny_model("olmoe", tmp_path / "olmoe")
    rng = random.Random(0)
    vocab = TINY_MODELS["olmoe"]().vocab_size
    prompts = [[rng.randrange(3, vocab) for _ in range(n)] for n in (5, 19, 1)]
    params = SamplingParams(max_tokens=4, temperature=0.0)

    def tokens(backend: str) -> tuple[list[list[int]], LLMEngine]:
        config = EngineConfig(
            model=str(folder),
            dtype="float32",
            attention_backend=backend,
            max_num_blocks=16,
            max_model_len=64,
        )
        engine = LLMEngine(config)
        return [o.token_ids for o in engine.generate(prompts, params, use_tqdm=False)], engine

    expected, _ = tokens("torch")
    actual, engine = tokens("triton")
    blocks = [m for m in engine.runner.model.modules() if isinstance(m, SparseMoe)]
    assert blocks and all(isinstance(block.fused, TritonMoe) for block in blocks)
    assert actual == expected
