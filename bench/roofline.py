"""Decode-step roofline: how close our engine's decode step comes to what the machine
allows, for one model over a set of batch sizes.

    python -m bench.roofline                                  # SmolLM2, bf16, batch 1,8,32,64
    python -m bench.roofline --model qwen2.5-0.5b-shape --batch 1,64 --context 256
    python -m bench.roofline --model path/to/hf-folder --dtype float32 --threads 2 \\
        --json out.json

``--model`` is a benchmark model of bench/models.py (``smollm2``,
``qwen2.5-0.5b-shape``) or anything the engine loads (a Hugging Face folder, a hub
id, a .gguf file). Results go to a table on stdout and to JSON (``--json``; by
default ``bench/results/roofline-<model>-<dtype>-t<threads>.json``).

What is measured, on the engine's device with ``--threads`` torch threads (medians of
``--repeats`` timed runs after warm-up):

- Memory bandwidth (GB/s): ``read`` is a sum over a large fp32 buffer (``--buffer-mib``,
  1 GiB by default: far past the caches), bytes read / time. ``copy`` is a copy
  between two such buffers, counted as 2x the buffer (read + write). A decode step
  mostly reads weights, so ``read`` is the bandwidth the roofline uses.
- Matmul throughput (TFLOP/s): a square ``--matmul-size`` matmul in bf16 and fp32
  (2 n^3 FLOPs / time); the figure for the run's dtype is the compute roof.
- Decode-shape matmuls: ``[batch, in] x [in, out]`` (as ``F.linear``) for every
  projection of the model (merged qkv, o, merged gate/up, down, lm_head), cycling
  over copies of the weight that together exceed ``--flush-mib`` so the weights come
  from memory as they do in a real step. ``matmul-only ms`` adds them up for one step
  (layers x the per-layer projections + lm_head): the part of the step that is matmuls.

What a decode step must do (every sequence adds one token to ``--context`` cached
tokens, so attention covers context + 1 positions):

- bytes: every weight once in the dtype (layer weights, the final norm, the lm_head,
  or the tied embedding, read once for the whole batch's logits), the embedding rows
  of the batch's tokens when the embedding is not tied, and the KV cache:
  2 * layers * kv_heads * head_dim * (context + 1) * batch * element size. Weights the
  model keeps quantized (a GGUF file's blocks, int8) count with their stored bytes:
  the table's ``MB/step`` is then what the quantized step reads.
- FLOPs: 2 * matmul weights * batch (projections and lm_head; biases and norms are
  not counted) plus attention, 4 * layers * heads * head_dim * (context + 1) * batch.
- bound = max(bytes / read bandwidth, FLOPs / matmul throughput of the dtype).

And the engine: one ``LLMEngine`` with a KV cache big enough for the largest batch;
each step is the model's forward pass over synthetic decode inputs plus the
last-token logits, as ModelRunner runs them (eagerly: no CUDA graphs). Per batch:
step ms, tokens/s (batch / step time), achieved GB/s and TFLOP/s (the step's bytes
and FLOPs above / step time), and step / bound (1.0 is the roofline). Then the whole
engine step, ``LLMEngine.step()`` on as many real greedy requests decoding (the
scheduler, input packing, sampling, the sequences' update and detokenizing around
the same forward pass): ``engine ms``, and ``outside ms``, what the step costs beyond
the model's pass (their prompts are shorter by the steps timed, so that they end
within the context).

Noise: every figure is a median; the machine line also gives the fastest run, and the
table its ``min ms``. On a machine shared with other jobs, threads that wait on each
other at every op suffer most: fewer ``--threads`` than busy cores gives steadier
figures.

Targets: at batch 1 the step within 1.5x of the bandwidth bound (1.3x where the
weights are kept quantized); at batch 64 (set for the Qwen2.5-0.5B shape) achieved
TFLOP/s at least 40% of the measured bf16 matmul throughput. Both are printed as met
or not for whatever model runs.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__" and not __package__:
    # Run as a file: import the repository's packages, not files next to this one.
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, apply_engine_thread_settings, parse_ints, resolve_model

apply_engine_thread_settings()  # before torch loads
import torch  # noqa: E402

if TYPE_CHECKING:
    from hetero_infer.engine.models import ModelConfig

DTYPES = ("bfloat16", "float16", "float32")
BATCH1_TARGET = 1.5  # step / bandwidth bound at batch 1, at most
QUANTIZED_BATCH1_TARGET = 1.3  # the same, where the weights are kept quantized
BATCH64_TARGET = 0.40  # achieved / bf16 matmul TFLOP/s at batch 64, at least


# ---- the model's shape, and what a decode step costs ----


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-family model that decide a decode step's bytes and FLOPs."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False

    @classmethod
    def from_config(cls, config: ModelConfig) -> ModelShape:
        """From the engine's ModelConfig: the sizes its model is built with."""
        return cls(
            num_layers=config.num_layers,
            hidden_size=config.hidden_size,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            intermediate_size=config.intermediate_size,
            vocab_size=config.vocab_size,
            tie_word_embeddings=config.tie_word_embeddings,
            qkv_bias=config.qkv_bias,
            o_bias=config.o_bias,
            mlp_bias=config.mlp_bias,
        )

    def layer_projections(self) -> dict[str, tuple[int, int]]:
        """Each layer's matmuls as the engine runs them (q/k/v and gate/up merged):
        name -> (in features, out features)."""
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {
            "qkv": (self.hidden_size, q + 2 * kv),
            "o": (q, self.hidden_size),
            "gate_up": (self.hidden_size, 2 * self.intermediate_size),
            "down": (self.intermediate_size, self.hidden_size),
        }

    def projections(self) -> dict[str, tuple[int, int]]:
        """The layer projections and the lm_head."""
        return {**self.layer_projections(), "lm_head": (self.hidden_size, self.vocab_size)}

    @property
    def layer_matmul_params(self) -> int:
        return sum(i * o for i, o in self.layer_projections().values())

    @property
    def layer_params(self) -> int:
        """Every parameter of one layer: matmul weights, biases, the two norms."""
        proj = self.layer_projections()
        biases = 0
        if self.qkv_bias:
            biases += proj["qkv"][1]
        if self.o_bias:
            biases += proj["o"][1]
        if self.mlp_bias:
            biases += proj["gate_up"][1] + proj["down"][1]
        return self.layer_matmul_params + biases + 2 * self.hidden_size

    @property
    def num_params(self) -> int:
        """Parameters of the whole model (a tied lm_head is the embedding: counted once)."""
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_word_embeddings else embeddings
        return self.num_layers * self.layer_params + self.hidden_size + embeddings + lm_head


@dataclass(frozen=True)
class StepCost:
    """What one decode step must move and compute."""

    weight_bytes: int
    kv_bytes: int
    matmul_flops: int
    attention_flops: int

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def flops(self) -> int:
        return self.matmul_flops + self.attention_flops


def step_cost(
    shape: ModelShape, batch: int, kv_positions: int, element_size: int, bytes_saved: int = 0
) -> StepCost:
    """Bytes and FLOPs of a decode step of ``batch`` sequences, each attending over
    ``kv_positions`` positions (its cached context and the new token). ``bytes_saved``:
    what the weights kept quantized spare (quantized_bytes_saved)."""
    # The lm_head (or the tied embedding) is read once for all the batch's logits.
    # An untied embedding table is not read whole: only the batch's token rows.
    weights = (
        shape.num_layers * shape.layer_params
        + shape.hidden_size  # final norm
        + shape.vocab_size * shape.hidden_size  # lm_head or tied embedding
        + (0 if shape.tie_word_embeddings else batch * shape.hidden_size)
    )
    kv = 2 * shape.num_layers * shape.num_kv_heads * shape.head_dim * kv_positions * batch
    matmul_params = shape.num_layers * shape.layer_matmul_params
    matmul_params += shape.hidden_size * shape.vocab_size
    # q.k and p.v: a multiply-add per head dim, per position, per head.
    attention = 4 * shape.num_layers * shape.num_heads * shape.head_dim * kv_positions * batch
    return StepCost(
        weight_bytes=weights * element_size - bytes_saved,
        kv_bytes=kv * element_size,
        matmul_flops=2 * matmul_params * batch,
        attention_flops=attention,
    )


def quantized_bytes_saved(model: Any, element_size: int) -> int:
    """Bytes a decode step does not read because weights are kept quantized: each
    quantized matrix's size in the run's dtype less its stored bytes. The linear layers
    hold theirs as ``quantized``; a quantized embedding counts where it is tied (the
    lm_head reads it whole; untied, a step reads only its tokens' rows)."""
    from hetero_infer.kernels.quantized import QuantizedWeight

    kept = [getattr(m, "quantized", None) for m in model.modules()]
    if model.lm_head is None:
        kept.append(model.embed_quantized)
    return sum(
        math.prod(w.shape) * element_size - w.nbytes for w in kept if isinstance(w, QuantizedWeight)
    )


def roofline_bound(cost: StepCost, read_gbps: float, matmul_tflops: float) -> dict[str, float]:
    """Seconds: the bandwidth bound, the compute bound, and the bound (their max)."""
    bandwidth = cost.bytes / (read_gbps * 1e9)
    compute = cost.flops / (matmul_tflops * 1e12)
    return {"bandwidth_s": bandwidth, "compute_s": compute, "bound_s": max(bandwidth, compute)}


# ---- timing ----


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timings(
    fn: Callable[[], Any], device: torch.device, repeats: int = 5, warmup: int = 1
) -> list[float]:
    """Wall times of fn() over ``repeats`` runs after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def median_seconds(
    fn: Callable[[], Any], device: torch.device, repeats: int = 5, warmup: int = 1
) -> float:
    """Median wall time of fn() over ``repeats`` runs after ``warmup`` untimed ones."""
    return statistics.median(timings(fn, device, repeats, warmup))


# ---- the machine ----


def measure_bandwidth(device: torch.device, buffer_bytes: int, repeats: int) -> dict[str, float]:
    """GB/s of a read (sum) and of a copy (read + write) over ``buffer_bytes`` buffers:
    the median run's, and the fastest run's (``*_best``: the least disturbed on a
    shared machine)."""
    # Filled, not empty: untouched pages would be faulted in during the first timing.
    src = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=device)
    read = timings(lambda: src.sum(), device, repeats)
    dst = torch.empty_like(src).fill_(0.0)
    copy = timings(lambda: dst.copy_(src), device, repeats)
    nbytes = src.numel() * src.element_size()
    return {
        "read_gbps": nbytes / statistics.median(read) / 1e9,
        "copy_gbps": 2 * nbytes / statistics.median(copy) / 1e9,
        "read_gbps_best": nbytes / min(read) / 1e9,
        "copy_gbps_best": 2 * nbytes / min(copy) / 1e9,
    }


def measure_matmul(
    dtype: torch.dtype, size: int, device: torch.device, repeats: int
) -> tuple[float, float]:
    """TFLOP/s of a square size x size x size matmul: (median run, fastest run)."""
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    times = timings(lambda: torch.matmul(a, b), device, repeats)
    flops = 2 * size**3
    return flops / statistics.median(times) / 1e12, flops / min(times) / 1e12


def measure_projections(
    shape: ModelShape,
    batches: list[int],
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    flush_bytes: int,
) -> list[dict[str, Any]]:
    """Time F.linear([batch, in], weight [out, in]) for every projection and batch.

    A step streams all of the model's weights, so each projection's weight comes from
    memory, not from a cache that still holds it from the last call: the timing
    cycles over enough copies of the weight to exceed ``flush_bytes``.
    """
    element_size = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for name, (n_in, n_out) in shape.projections().items():
        weight_bytes = n_in * n_out * element_size
        copies = max(1, math.ceil(flush_bytes / weight_bytes))
        first = torch.randn(n_out, n_in, device=device).to(dtype)
        weights = [first] + [first.clone() for _ in range(copies - 1)]
        for batch in batches:
            x = torch.randn(batch, n_in, device=device).to(dtype)

            def run(x: torch.Tensor = x, weights: list[torch.Tensor] = weights) -> None:
                for w in weights:
                    torch.nn.functional.linear(x, w)

            seconds = median_seconds(run, device, repeats) / copies
            rows.append(
                {
                    "projection": name,
                    "batch": batch,
                    "in": n_in,
                    "out": n_out,
                    "seconds": seconds,
                    "tflops": 2 * batch * n_in * n_out / seconds / 1e12,
                    "gbps": weight_bytes / seconds / 1e9,
                }
            )
        del weights, first
    return rows


def matmul_only_seconds(shape: ModelShape, projections: list[dict[str, Any]], batch: int) -> float:
    """One step's matmul time from the projection timings: layers x the layer's
    projections, plus the lm_head once."""
    times = {r["projection"]: r["seconds"] for r in projections if r["batch"] == batch}
    layer = sum(times[name] for name in shape.layer_projections())
    return shape.num_layers * layer + times["lm_head"]


# ---- the engine ----


def blocks_needed(batch: int, context: int, block_size: int) -> int:
    """KV blocks for ``batch`` sequences of context + 1 tokens (runner.inputs.synthetic puts
    each sequence on its own blocks)."""
    return batch * -(-(context + 1) // block_size)


def build_engine(model: str, dtype: str, max_batch: int, context: int, device: str = "auto") -> Any:
    """An LLMEngine whose KV cache holds ``max_batch`` sequences of context + 1 tokens."""
    from hetero_infer.engine import EngineConfig, LLMEngine, apply_process_settings

    block_size = 16
    config = EngineConfig(
        model=model,
        dtype=dtype,
        device=device,
        block_size=block_size,
        max_num_seqs=max_batch,
        max_model_len=context + 1,
        max_num_blocks=blocks_needed(max_batch, context, block_size),
        enable_prefix_caching=False,
    )
    apply_process_settings(config)  # as the server's entry point does
    return LLMEngine(config)


def time_decode_step(
    runner: Any, batch: int, context: int, repeats: int, warmup: int
) -> list[float]:
    """Seconds of each timed decode step of ``batch`` sequences with ``context`` cached
    tokens each: the model's forward pass and the last-token logits."""
    need = blocks_needed(batch, context, runner.block_size)
    if need > runner.num_blocks:
        raise ValueError(
            f"batch {batch} at context {context} needs {need} KV blocks; the cache has "
            f"{runner.num_blocks}"
        )
    model = runner.model
    with torch.inference_mode():
        inputs = runner.inputs.synthetic([(context, 1)] * batch)

        def step() -> None:
            hidden = runner.forward(inputs)  # the fast path where it runs, as a step does
            model.compute_logits(hidden[inputs.logits_indices])

        return timings(step, runner.device, repeats, warmup)


def time_engine_steps(
    engine: Any, batch: int, context: int, repeats: int, warmup: int
) -> list[float]:
    """Seconds of each timed ``engine.step()`` while ``batch`` greedy requests decode,
    their prompts random tokens about ``context`` long (shorter by the steps to come,
    so that they end within it); the requests are aborted after."""
    from hetero_infer.engine import SamplingParams

    steps = warmup + repeats
    prompt_len = max(1, context - steps)
    rng = random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
    ids = [
        engine.add_request([rng.randrange(vocab) for _ in range(prompt_len)], params)
        for _ in range(batch)
    ]
    started: set[str] = set()
    while len(started) < batch:  # the prefill, chunked or not
        started |= {out.request_id for out in engine.step() if out.token_ids}
    try:
        return timings(engine.step, engine.runner.device, repeats, warmup)
    finally:
        for request_id in ids:
            engine.abort(request_id)


def step_rows(
    shape: ModelShape,
    batches: list[int],
    kv_positions: int,
    element_size: int,
    read_gbps: float,
    matmul_tflops: float,
    step_times: dict[int, list[float]],
    bytes_saved: int = 0,
) -> list[dict[str, Any]]:
    """Per batch: the step's cost, its bound, and the measured step (the median of
    ``step_times``) against them."""
    rows = []
    for batch in batches:
        cost = step_cost(shape, batch, kv_positions, element_size, bytes_saved)
        bound = roofline_bound(cost, read_gbps, matmul_tflops)
        seconds = statistics.median(step_times[batch])
        rows.append(
            {
                "batch": batch,
                **asdict(cost),
                "bytes": cost.bytes,
                "flops": cost.flops,
                **bound,
                "step_s": seconds,
                # The fastest run: on a shared machine, the least disturbed one.
                "step_min_s": min(step_times[batch]),
                "tokens_per_s": batch / seconds,
                "achieved_gbps": cost.bytes / seconds / 1e9,
                "achieved_tflops": cost.flops / seconds / 1e12,
                "step_over_bound": seconds / bound["bound_s"],
                "step_over_bandwidth_bound": seconds / bound["bandwidth_s"],
            }
        )
    return rows


def check_targets(
    rows: list[dict[str, Any]], bf16_tflops: float, quantized: bool = False
) -> dict[str, dict[str, Any]]:
    """The two targets, for the batches that ran."""
    targets: dict[str, dict[str, Any]] = {}
    by_batch = {r["batch"]: r for r in rows}
    if 1 in by_batch:
        ratio = by_batch[1]["step_over_bandwidth_bound"]
        limit = QUANTIZED_BATCH1_TARGET if quantized else BATCH1_TARGET
        targets["batch1_bandwidth"] = {
            "step_over_bandwidth_bound": ratio,
            "limit": limit,
            "met": ratio <= limit,
        }
    if 64 in by_batch:
        fraction = by_batch[64]["achieved_tflops"] / bf16_tflops
        targets["batch64_matmul"] = {
            "fraction_of_bf16_matmul": fraction,
            "limit": BATCH64_TARGET,
            "met": fraction >= BATCH64_TARGET,
        }
    return targets


# ---- the command line ----


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2", help="smollm2, qwen2.5-0.5b-shape, or a folder"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--batch", type=parse_ints, default=[1, 8, 32, 64], help="e.g. 1,8,32,64")
    parser.add_argument("--context", type=int, default=256, help="cached tokens per sequence")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure (median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed decode steps first")
    parser.add_argument("--buffer-mib", type=int, default=1024, help="bandwidth buffer size")
    parser.add_argument("--matmul-size", type=int, default=None, help="square matmul n")
    parser.add_argument("--flush-mib", type=int, default=128, help="weight copies per projection")
    parser.add_argument("--json", type=Path, default=None, help="output file")
    args = parser.parse_args(argv)

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    batches = sorted(set(args.batch))
    model = resolve_model(args.model)
    dtype = getattr(torch, args.dtype)
    element_size = torch.tensor([], dtype=dtype).element_size()

    engine = build_engine(model, args.dtype, batches[-1], args.context, args.device)
    runner = engine.runner
    device = runner.device
    shape = ModelShape.from_config(engine.model_config)
    # On a CPU a 2048 matmul already runs at full rate and 8192 would take seconds.
    matmul_size = args.matmul_size or (8192 if device.type == "cuda" else 2048)

    print(f"device {device}, {threads} threads; measuring the machine ...", flush=True)
    bandwidth = measure_bandwidth(device, args.buffer_mib * 2**20, args.repeats)
    matmuls = {
        name: measure_matmul(getattr(torch, name), matmul_size, device, args.repeats)
        for name in dict.fromkeys(["bfloat16", "float32", args.dtype])
    }
    tflops = {name: median for name, (median, _) in matmuls.items()}
    projections = measure_projections(
        shape, batches, dtype, device, args.repeats, args.flush_mib * 2**20
    )

    step_times, engine_times = {}, {}
    for batch in batches:
        step_times[batch] = time_decode_step(runner, batch, args.context, args.repeats, args.warmup)
        engine_times[batch] = time_engine_steps(
            engine, batch, args.context, args.repeats, args.warmup
        )
        median = statistics.median(step_times[batch])
        whole = statistics.median(engine_times[batch])
        print(
            f"  batch {batch}: {median * 1e3:.2f} ms, engine step {whole * 1e3:.2f} ms", flush=True
        )
    bytes_saved = quantized_bytes_saved(runner.model, element_size)
    rows = step_rows(
        shape,
        batches,
        args.context + 1,
        element_size,
        bandwidth["read_gbps"],
        tflops[args.dtype],
        step_times,
        bytes_saved,
    )
    for row in rows:
        row["matmul_only_s"] = matmul_only_seconds(shape, projections, row["batch"])
        row["engine_step_s"] = statistics.median(engine_times[row["batch"]])
        row["outside_model_s"] = row["engine_step_s"] - row["step_s"]
    targets = check_targets(rows, tflops["bfloat16"], quantized=bytes_saved > 0)

    result = {
        "model": args.model,
        "model_path": Path(model).name,
        "shape": asdict(shape),
        "num_params": shape.num_params,
        "dtype": args.dtype,
        "quantized_bytes_saved": bytes_saved,
        "context": args.context,
        "threads": threads,
        "device": str(device),
        "torch": torch.__version__,
        "repeats": args.repeats,
        "machine": {
            **bandwidth,
            "matmul_size": matmul_size,
            "matmul_tflops": tflops,
            "matmul_tflops_best": {name: best for name, (_, best) in matmuls.items()},
        },
        "steps": rows,
        "projections": projections,
        "targets": targets,
    }
    print_report(result)
    path = args.json or RESULTS_DIR / (
        f"roofline-{Path(args.model).name}-{args.dtype}-t{threads}.json"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")
    return result


def print_report(result: dict[str, Any]) -> None:
    machine = result["machine"]
    tf, best = machine["matmul_tflops"], machine["matmul_tflops_best"]
    n = machine["matmul_size"]
    print(
        f"\nmachine ({result['device']}, {result['threads']} threads), median (fastest run):"
        f"\n  read {machine['read_gbps']:.1f} ({machine['read_gbps_best']:.1f}) GB/s, "
        f"copy {machine['copy_gbps']:.1f} ({machine['copy_gbps_best']:.1f}) GB/s"
        f"\n  matmul {n}x{n}x{n}: "
        + ", ".join(f"{name} {tf[name]:.3f} ({best[name]:.3f})" for name in tf)
        + " TFLOP/s"
    )
    print(
        f"model {result['model']}: {result['num_params'] / 1e6:.1f}M params, "
        f"{result['dtype']}, context {result['context']}"
        + (
            f", {result['quantized_bytes_saved'] / 1e6:.0f} MB a step spared by weights kept "
            "quantized"
            if result["quantized_bytes_saved"]
            else ""
        )
        + "\n"
    )
    header = (
        f"{'batch':>5} {'MB/step':>8} {'GFLOP':>8} {'bw ms':>8} {'flop ms':>8} "
        f"{'step ms':>9} {'tok/s':>8} {'GB/s':>7} {'TFLOP/s':>8} {'/bound':>7} "
        f"{'matmul ms':>9} {'min ms':>8} {'engine ms':>9} {'outside ms':>10}"
    )
    print(header)
    for r in result["steps"]:
        print(
            f"{r['batch']:>5} {r['bytes'] / 1e6:>8.1f} {r['flops'] / 1e9:>8.2f} "
            f"{r['bandwidth_s'] * 1e3:>8.2f} {r['compute_s'] * 1e3:>8.2f} "
            f"{r['step_s'] * 1e3:>9.2f} {r['tokens_per_s']:>8.1f} "
            f"{r['achieved_gbps']:>7.1f} {r['achieved_tflops']:>8.4f} "
            f"{r['step_over_bound']:>6.2f}x {r['matmul_only_s'] * 1e3:>9.2f} "
            f"{r['step_min_s'] * 1e3:>8.2f} {r['engine_step_s'] * 1e3:>9.2f} "
            f"{r['outside_model_s'] * 1e3:>10.2f}"
        )
    print("\ndecode-shape matmuls, TFLOP/s (GB/s of weights)")
    names = list(dict.fromkeys(p["projection"] for p in result["projections"]))
    print(f"{'batch':>5} " + " ".join(f"{name:>17}" for name in names))
    for batch in dict.fromkeys(p["batch"] for p in result["projections"]):
        cells = {p["projection"]: p for p in result["projections"] if p["batch"] == batch}
        print(
            f"{batch:>5} "
            + " ".join(
                f"{cells[name]['tflops']:>8.4f} ({cells[name]['gbps']:>5.1f})" for name in names
            )
        )
    print()
    targets = result["targets"]
    if "batch1_bandwidth" in targets:
        t = targets["batch1_bandwidth"]
        print(
            f"target batch 1: step / bandwidth bound {t['step_over_bandwidth_bound']:.2f}x "
            f"(<= {t['limit']}x): {'met' if t['met'] else 'NOT met'}"
        )
    if "batch64_matmul" in targets:
        t = targets["batch64_matmul"]
        print(
            f"target batch 64 (set for qwen2.5-0.5b-shape): "
            f"{t['fraction_of_bf16_matmul']:.0%} of bf16 matmul throughput "
            f"(>= {t['limit']:.0%}): {'met' if t['met'] else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
