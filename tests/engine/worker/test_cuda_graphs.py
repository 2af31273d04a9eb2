"""CUDA graphs of decode steps (engine/worker/cuda_graphs.py) on a GPU: an engine that
replays them gives, token for token, the greedy output of the same engine run eagerly
(enforce_eager) and of transformers on the same fp32 weights.

The tiny Llama (one KV head, GQA 3, head_dim 24) decodes five prompts whose requests
end one after another, so decode batches of 5, 4, 3, 2 and 1 replay the graphs captured
at 1, 2, 4 and 8 (max_num_seqs 8): 5 and 3 run padded. The graphs are captured for
max_model_len 1024, so their attention splits the context (flash-decoding) where an
eager step over these short contexts does not, and most splits replay empty. A second
pass runs after the larger batches have left their block tables in the buffers.

The CPU runs the same engine and comparison with transformers (no graphs there), so
that this file's code runs on every machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hetero_infer import kernels
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.worker.cuda_graphs import DecodeGraphs
from hetero_infer.engine.worker.input_batch import ModelInputs

from tests.engine.test_exactness import MAX_NEW_TOKENS, random_prompts, reference_outputs
from tests.tiny_models import TINY_MODELS, save_tiny_model

MODEL = "llama"
# Five requests that end one after another (at most transformers' MAX_NEW_TOKENS).
MAX_TOKENS = [MAX_NEW_TOKENS, 19, 14, 9, 4]
SETTINGS = dict(
    dtype="float32", block_size=16, max_num_blocks=80, max_model_len=1024, max_num_seqs=8
)
CAPTURED = [1, 2, 4, 8]  # CUDA_GRAPH_BATCH_SIZES below max_num_seqs, and max_num_seqs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, list[list[int]], list[list[int]]]:
    """(model folder, 5 prompts of 3 to 64 tokens, transformers' greedy tokens for each
    cut to its request's max_tokens)."""
    folder = save_tiny_model(MODEL, tmp_path_factory.mktemp(MODEL))
    prompts = random_prompts(1, TINY_MODELS[MODEL]().vocab_size)[2:11:2]
    expected = reference_outputs(folder, prompts)
    return folder, prompts, [out[:n] for out, n in zip(expected, MAX_TOKENS, strict=True)]


def make_engine(folder: Path, device: str, **settings: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), device=device, **SETTINGS, **settings))


def greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = [SamplingParams(max_tokens=n, temperature=0.0) for n in MAX_TOKENS]
    return [out.token_ids for out in engine.generate(prompts, params, use_tqdm=False)]


def skip_unless_compiled_triton() -> None:
    """Graphs need the Triton backend (its metadata is the static buffers) compiled: the
    interpreter (tests/conftest.py turns it on unless TRITON_INTERPRET=0) copies
    tensors to the host, which no graph can capture."""
    if not kernels.triton_available():
        pytest.skip("needs triton")
    from hetero_infer.kernels.triton_utils import interpreting

    if interpreting():
        pytest.skip("the Triton kernels are interpreted in this run: set TRITON_INTERPRET=0")


class ReplayLog:
    """Logs each replay of ``graphs`` as (sequences in the step, the graph's batch size,
    whether the rows past the step's are padding as the graph reads them: no KV stored,
    slot -1, and a context of 1)."""

    def __init__(self, graphs: DecodeGraphs) -> None:
        self.graphs = graphs
        self.entries: list[tuple[int, int, bool]] = []
        self.captured = dict(graphs.graphs)
        self.num_seqs = 0
        run = graphs.run

        def logged_run(inputs: ModelInputs) -> torch.Tensor:
            self.num_seqs = inputs.meta.num_seqs
            return run(inputs)

        graphs.run = logged_run
        graphs.graphs = {size: LoggedGraph(self, size) for size in graphs.graphs}

    def replay(self, size: int) -> None:
        n, graphs = self.num_seqs, self.graphs
        padding = bool(
            (graphs.slot_mapping[:n] >= 0).all()
            and (graphs.slot_mapping[n:size] == -1).all()
            and (graphs.context_lens[n:size] == 1).all()
        )
        self.entries.append((n, size, padding))
        self.captured[size].replay()


class LoggedGraph:
    """Stands for the captured graph of one batch size: replays it through the log."""

    def __init__(self, log: ReplayLog, size: int) -> None:
        self.log, self.size = log, size

    def replay(self) -> None:
        self.log.replay(self.size)


@pytest.fixture(scope="module")
def eager_tokens(tiny) -> list[list[int]]:
    skip_unless_compiled_triton()
    folder, prompts, _ = tiny
    engine = make_engine(folder, "cuda", enforce_eager=True)
    assert engine.runner.fast_path is None
    return greedy(engine, prompts)


@pytest.fixture(scope="module")
def graphed(tiny) -> tuple[DecodeGraphs | None, ReplayLog | None, list[list[list[int]]]]:
    """(the engine's graphs, their replays, its tokens in each of two passes)."""
    skip_unless_compiled_triton()
    folder, prompts, _ = tiny
    engine = make_engine(folder, "cuda")
    graphs = engine.runner.fast_path
    # None or another fast path: checked by the test, which says so
    log = ReplayLog(graphs) if isinstance(graphs, DecodeGraphs) else None
    return graphs, log, [greedy(engine, prompts) for _ in range(2)]


@pytest.mark.cuda
def test_graphs_are_captured_at_each_batch_size(graphed):
    graphs, log, _ = graphed
    assert isinstance(graphs, DecodeGraphs), "no CUDA graphs: capture failed (see the log)"
    assert graphs.batch_sizes == CAPTURED
    assert all(isinstance(log.captured[size], torch.cuda.CUDAGraph) for size in CAPTURED)


@pytest.mark.cuda
def test_graph_replays_give_the_eager_tokens(graphed, eager_tokens):
    _, log, passes = graphed
    assert log is not None, "no CUDA graphs were captured"
    for number, tokens in enumerate(passes, 1):
        assert tokens == eager_tokens, f"pass {number}"
    assert all(padding for _, _, padding in log.entries), log.entries
    # batches between the captured sizes ran padded, through several of the graphs
    assert any(n < size for n, size, _ in log.entries), log.entries
    assert len({size for _, size, _ in log.entries}) >= 3, log.entries


@pytest.mark.cuda
def test_greedy_on_cuda_matches_transformers(tiny, eager_tokens, graphed):
    _, _, expected = tiny
    assert eager_tokens == expected
    assert graphed[2][0] == expected


def test_greedy_on_the_cpu_matches_transformers(tiny):
    folder, prompts, expected = tiny
    assert greedy(make_engine(folder, "cpu"), prompts) == expected
