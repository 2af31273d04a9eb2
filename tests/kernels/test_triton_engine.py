"""The Triton path end to end.

The engine test runs tiny models of several families through LLMEngine with every
kernel forced to Triton (in the interpreter), the sampler included, and checks its
greedy tokens against the torch path, over a mixed batch with chunked prefill and
prefix-cache hits. (How the backend is chosen: tests/kernels/test_selection.py.)
"""

from __future__ import annotations

import collections
import random

import pytest
import torch
from hetero_infer import kernels
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.worker.cuda_graphs import DecodeGraphs

from tests.tiny_models import TINY_MODELS, save_tiny_model

triton_installed = pytest.mark.skipif(not kernels.triton_available(), reason="needs triton")


# llama: head_dim 24, GQA 3, Llama-3 rope; qwen2: head_dim 12, no GQA, q/k/v biases;
# gemma3: q/k norms, norms after attention and the MLP, GELU, sliding layers with their
# own RoPE tables; gemma2: attention and final soft-capping. (mistral adds nothing the
# kernel tests lack, and costs the most in the interpreter.)
@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma3", "gemma2"])
def tiny(request, tmp_path_factory):
    """(model folder, prompts: two share an 18-token prefix, a full block and a bit)."""
    folder = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    rng = random.Random(0)
    vocab = TINY_MODELS[request.param]().vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(18)]
    prompts = [
        prefix + [rng.randrange(3, vocab) for _ in range(4)],
        [rng.randrange(3, vocab) for _ in range(5)],
        prefix + [rng.randrange(3, vocab) for _ in range(13)],
        [rng.randrange(3, vocab)],
    ]
    return folder, prompts


@pytest.fixture(scope="module")
def torch_outputs(tiny):
    folder, prompts = tiny
    return run_engine(make_engine(folder, "torch"), prompts)[0]


def make_engine(folder, backend: str, async_scheduling: bool = False) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(folder),
            dtype="float32",
            attention_backend=backend,
            async_scheduling=async_scheduling,
            block_size=16,
            max_num_blocks=16,
            max_model_len=128,
            max_num_batched_tokens=16,  # long prompts are chunked, sharing steps with decodes
        )
    )


def run_engine(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list, dict]:
    # Greedy; half of them asking for logprobs, which takes the batch to the sampler
    # kernel rather than the plain greedy pick. One pass: the long prompts are chunked,
    # and the second finds the first one's full block in the prefix cache (a second
    # pass would only find more). Four tokens: the steps of decodes alone, past Gemma's
    # windows, come last, and a window dropped there first changed the third token.
    params = [
        SamplingParams(max_tokens=4, temperature=0.0, logprobs=0 if i % 2 else None)
        for i in range(len(prompts))
    ]
    outputs = [out.token_ids for out in engine.generate(prompts, params, use_tqdm=False)]
    return outputs, engine.memory_stats()


def batch_kinds(meta) -> set[str]:
    """What an attention call's batch holds: decodes, first chunks, chunks after context."""
    query_lens = (meta.query_start_loc[1:] - meta.query_start_loc[:-1]).tolist()
    cached = (meta.context_lens - meta.query_start_loc.diff()).tolist()
    kinds = set()
    for n, c in zip(query_lens, cached, strict=True):
        kinds.add("decode" if n == 1 and c > 0 else "first chunk" if c == 0 else "extend")
    return kinds


def triton_launchers() -> list[str]:
    """The Triton launchers the Triton backend hands out (kernels/triton_backend.py)."""
    from hetero_infer.kernels import triton_backend

    return [name for name in vars(triton_backend) if name.endswith("_triton")]


def count_triton_calls(monkeypatch) -> collections.Counter:
    """Count calls into each Triton launcher, and the kinds of batch attention saw
    ("mixed: ..." when one batch held several kinds). Engines built afterwards get the
    counting launchers: the kernels are bound when the model is built."""
    from hetero_infer.kernels import triton_backend

    calls: collections.Counter = collections.Counter()
    for name in triton_launchers():
        launch = getattr(triton_backend, name)

        def counted(*args, _name=name, _launch=launch, **kwargs):
            calls[_name] += 1
            if _name == "paged_attention_triton":
                calls["batch: " + ", ".join(sorted(batch_kinds(args[3])))] += 1
            return _launch(*args, **kwargs)

        monkeypatch.setattr(triton_backend, name, counted)
    return calls


@triton_installed
def test_engine_triton_path_matches_torch_path(tiny, torch_outputs, monkeypatch):
    folder, prompts = tiny
    calls = count_triton_calls(monkeypatch)
    run_engine(make_engine(folder, "torch"), prompts[:1])
    assert not calls
    expected = torch_outputs
    # As CUDA runs it by default: each step handed over before the last one's tokens
    # are applied (the torch path's steps one at a time).
    engine = make_engine(folder, "triton", async_scheduling=True)
    actual, stats = run_engine(engine, prompts)
    # Every kernel ran in Triton; Gemma's GELU-and-mul has none (torch's op runs it).
    # (LoRA's run only with adapters: test_engine_triton_lora_matches_torch_path; the
    # experts' only in an MoE model: tests/kernels/test_moe_triton.py.)
    launchers = {name for name in triton_launchers() if "lora" not in name}
    if engine.model_config.moe is None:
        launchers.discard("pack_moe_triton")
    if engine.model_config.hidden_act != "silu":
        launchers.discard("silu_and_mul_triton")
    assert launchers <= set(calls), calls
    # chunked prefill next to decodes, in one batch
    assert calls["batch: decode, extend"] or calls["batch: decode, extend, first chunk"], calls
    assert calls["batch: decode"], calls
    assert stats["prefix_cache_hits"] > 0
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert got == want, f"prompt {i}: triton {got} != torch {want}"


@triton_installed
def test_engine_triton_lora_matches_torch_path(tiny, monkeypatch, tmp_path):
    """LoRA adapters mixed with the base model in one batch, their updates by the Triton
    kernels (kernels/lora_triton.py), against the torch path's tokens."""
    from tests.lora_adapters import save_adapter

    folder, prompts = tiny
    if not folder.name.startswith("llama"):
        pytest.skip("one family is enough here: the adapters' math is the kernel tests'")
    # The prompts' last six tokens: the kernels' cost goes with the rows they update, and
    # 18 tokens still take two steps of 16, the first holding rows of a, b and no adapter
    prompts = [prompt[-6:] for prompt in prompts]
    adapters = {
        "a": save_adapter(folder, tmp_path / "a", seed=1),
        "b": save_adapter(folder, tmp_path / "b", seed=2, rank=4, modules=["q_proj", "v_proj"]),
    }
    loras = ["a", None, "b", "a"]

    def run(backend: str, loras: list) -> list:
        engine = LLMEngine(make_engine(folder, backend).config.replace(enable_lora=True))
        for name, path in adapters.items():
            engine.adapters.load(name, str(path))
        params = SamplingParams(max_tokens=4, temperature=0.0)
        outputs = engine.generate(prompts, params, use_tqdm=False, lora_request=loras)
        return [out.token_ids for out in outputs]

    expected = run("torch", loras)
    base = run("torch", [None] * len(prompts))
    assert [e != b for e, b in zip(expected, base, strict=True)] == [True, False, True, True]
    calls = count_triton_calls(monkeypatch)
    assert run("triton", loras) == expected
    assert calls["add_lora_triton"] and calls["pack_lora_triton"], calls


class EagerReplay:
    """Stands in for a captured CUDA graph on the CPU: replay runs the forward pass on
    the static buffers, as the graph would, and notes its batch size in ``replayed``."""

    def __init__(self, graphs: DecodeGraphs, size: int, replayed: list[int]) -> None:
        self.graphs, self.size, self.replayed = graphs, size, replayed

    def replay(self) -> None:
        self.replayed.append(self.size)
        self.graphs.outputs[self.size] = self.graphs._forward(self.size)


@triton_installed
@pytest.mark.parametrize("tiny", ["llama"], indirect=True)
def test_decode_graph_buffers(tiny, torch_outputs):
    """The CUDA-graph decode path's buffer handling (padding rows, stale block tables
    from earlier, larger batches), with the graphs replaced by eager replays of the
    same static buffers, under the interpreter."""
    folder, prompts = tiny
    engine = make_engine(folder, "triton")
    graphs = DecodeGraphs(engine.runner, [1, 2, 8])  # 3 or 4 decodes run padded to 8
    replayed: list[int] = []
    for size in graphs.batch_sizes:
        graphs.graphs[size] = EagerReplay(graphs, size, replayed)
    with torch.inference_mode():
        assert graphs._matches_eager()
    replayed.clear()
    engine.runner.fast_path = graphs
    actual, _ = run_engine(engine, prompts)
    assert actual == torch_outputs
    # 8 replayed on a later step's values, and 2 after it (the short prompts done)
    assert replayed.count(8) > 1 and 2 in replayed[replayed.index(8) + 1 :], replayed


def test_config_and_cli_accept_the_triton_backend():
    from hetero_infer.server.cli import build_serve_parser

    assert EngineConfig(attention_backend="triton").attention_backend == "triton"
    with pytest.raises(ValueError, match="attention_backend"):
        EngineConfig(attention_backend="flash")
    args = build_serve_parser().parse_args(["--attention-backend", "triton"])
    assert args.attention_backend == "triton"
