"""Mixture-of-experts decode on the CPU: ours and llama.cpp's llama-server on one
OLMoE-shaped GGUF file of random weights, one user and 16, same threads.

    python -m bench.moe                          # 2 rounds, 2 threads
    python -m bench.moe --rounds 3 --users 1,16 --threads 2

The file (``olmoe_gguf``, written once under the benchmark cache) has OLMoE-1B-7B's
shapes: 16 layers, hidden 2048, 16 heads (no GQA), 64 experts of width 1024 with 8
per token, vocab 50304, q/k norms across heads; every 2-D and 3-D weight in Q4_K
(random blocks: random nibbles and 6-bit scales under a small fp16 scale), the norms
and the routers F32 (as llama-quantize leaves them), and a byte-level BPE tokenizer
over the vocabulary (bench.models.byte_level_tokenizer). Writing 3.8 GB of random
blocks takes about a minute.

Per round, each system in turn (the order alternating between rounds) is started on
the file (bench/peers.py's start, readiness, stop), sent ``--requests`` greedy
completions one at a time (``--prompt-len`` 64, ``--output-len`` 128, ignore_eos),
then ``--users`` concurrent users' worth (4 requests each). Reported per system and
user count: one user's decode speed (1 / TPOT, the median over the round's requests),
and with 16 users the output throughput; ours / llama-server per round and over the
rounds' medians.

Bandwidth: the machine's read bandwidth at the run's threads (bench/roofline.py's
``measure_bandwidth``, a 1 GiB sum, the median of 5), and the bytes one decode step
reads at batch 1: the file's weights except the embedding (a row per token) and the
experts, plus top_k / num_experts of the experts (the active experts' share). The
fraction is those bytes times one user's decode speed over the bandwidth.

Written to ``--out``: ``moe-olmoe-shape.json`` (each round's figures and spreads, the
commands, the file's byte counts, the bandwidth, the 1-minute load average as each
system's round began: other work on a shared machine shows there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import gguf
import numpy as np

from bench import peers, serving
from bench.common import RESULTS_DIR, parse_ints, portable
from bench.gguf_files import _Writer
from bench.models import byte_level_tokenizer, cache_root
from bench.single_stream import decode_tokens_per_s, spread

MODEL = "olmoe-shape"
# OLMoE-1B-7B's shapes
SHAPE = dict(
    layers=16, hidden=2048, heads=16, kv_heads=16, experts=64, top_k=8, width=1024,
    vocab=50304, context=4096, rope_theta=10000.0, eps=1e-5,
)  # fmt: skip
Q4_K = gguf.GGMLQuantizationType.Q4_K
SYSTEMS = ("ours", "llama-server")


# ---- the file ----


def random_q4_k(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random Q4_K blocks of a tensor of ``shape`` (its last dim a multiple of 256):
    uint8 [*shape[:-1], row_bytes]. Each 144-byte block: fp16 d and dmin (small, so that
    weights stay within about +-0.06), 12 bytes of random 6-bit scales and mins, 128 of
    random nibbles."""
    blocks = rng.integers(0, 256, size=(*shape[:-1], shape[-1] // 256, 144), dtype=np.uint8)
    blocks[..., 0:2] = np.frombuffer(np.float16(2**-14).tobytes(), np.uint8)
    blocks[..., 2:4] = np.frombuffer(np.float16(2**-15).tobytes(), np.uint8)
    return blocks.reshape(*shape[:-1], -1)


def olmoe_tensors() -> list[tuple[str, tuple[int, ...], str]]:
    """(name, torch-order shape, "q4_k" or "f32") of every tensor, in file order."""
    s = SHAPE
    hidden, width, experts = s["hidden"], s["width"], s["experts"]
    kv = s["kv_heads"] * hidden // s["heads"]
    tensors = [("token_embd.weight", (s["vocab"], hidden), "q4_k")]
    for i in range(s["layers"]):
        tensors += [
            (f"blk.{i}.attn_norm.weight", (hidden,), "f32"),
            (f"blk.{i}.attn_q.weight", (hidden, hidden), "q4_k"),
            (f"blk.{i}.attn_k.weight", (kv, hidden), "q4_k"),
            (f"blk.{i}.attn_v.weight", (kv, hidden), "q4_k"),
            (f"blk.{i}.attn_output.weight", (hidden, hidden), "q4_k"),
            (f"blk.{i}.attn_q_norm.weight", (hidden,), "f32"),
            (f"blk.{i}.attn_k_norm.weight", (kv,), "f32"),
            (f"blk.{i}.ffn_norm.weight", (hidden,), "f32"),
            (f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), "f32"),
            (f"blk.{i}.ffn_gate_exps.weight", (experts, width, hidden), "q4_k"),
            (f"blk.{i}.ffn_up_exps.weight", (experts, width, hidden), "q4_k"),
            (f"blk.{i}.ffn_down_exps.weight", (experts, hidden, width), "q4_k"),
        ]
    tensors += [
        ("output_norm.weight", (hidden,), "f32"),
        ("output.weight", (s["vocab"], hidden), "q4_k"),
    ]
    return tensors


def tensor_values(name: str, shape: tuple[int, ...], kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, sum(map(ord, name))])
    if kind == "q4_k":
        return random_q4_k(rng, shape)
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    return (0.05 * rng.standard_normal(shape)).astype(np.float32)  # the routers


def olmoe_gguf(out: Path | None = None, seed: int = 0) -> Path:
    """The OLMoE-shaped file, written on first use (tensors streamed one at a time, to
    a ``.partial`` file renamed when complete)."""
    out = out or cache_root() / f"{MODEL}.Q4_K.gguf"
    if out.is_file():
        return out
    s = SHAPE
    out.parent.mkdir(parents=True, exist_ok=True)
    folder = out.parent / f"{MODEL}-tokenizer"
    tokenizer = byte_level_tokenizer(s["vocab"])
    tokenizer.save_pretrained(folder)
    staging = out.with_suffix(".partial")
    writer = _Writer(staging, "olmoe")  # writes the tokenizer's empty merges
    writer.add_name(MODEL)
    writer.add_context_length(s["context"])
    writer.add_embedding_length(s["hidden"])
    writer.add_block_count(s["layers"])
    writer.add_feed_forward_length(s["width"])
    writer.add_expert_feed_forward_length(s["width"])
    writer.add_head_count(s["heads"])
    writer.add_head_count_kv(s["kv_heads"])
    writer.add_rope_freq_base(s["rope_theta"])
    writer.add_layer_norm_rms_eps(s["eps"])
    writer.add_expert_count(s["experts"])
    writer.add_expert_used_count(s["top_k"])
    writer.add_vocab_size(s["vocab"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_tokenizer(writer, folder, tokenizer.eos_token_id)
    tensors = olmoe_tensors()
    for name, shape, kind in tensors:
        if kind == "q4_k":
            nbytes = int(np.prod(shape[:-1])) * shape[-1] // 256 * 144
            writer.add_tensor_info(name, (*shape[:-1], nbytes // int(np.prod(shape[:-1]))),
                                   np.dtype(np.uint8), nbytes, raw_dtype=Q4_K)  # fmt: skip
        else:
            writer.add_tensor_info(name, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for name, shape, kind in tensors:
        writer.write_tensor_data(tensor_values(name, shape, kind, seed))
    writer.close()
    os.replace(staging, out)
    return out


def _add_tokenizer(writer: gguf.GGUFWriter, folder: Path, eos: int) -> None:
    """The byte-level BPE tokenizer as llama.cpp's converter writes one (bench's Qwen
    file's writer), bos and eos its last token."""
    from types import SimpleNamespace

    from bench.gguf_files import _add_tokenizer as add

    add(
        writer,
        folder,
        SimpleNamespace(vocab_size=SHAPE["vocab"], bos_token_id=eos, eos_token_id=eos),
    )


def step_bytes(path: Path) -> dict[str, int]:
    """Bytes a batch-1 decode step reads: the weights but the embedding and the
    experts, and the active experts' share (top_k / num_experts) of the experts."""
    reader = gguf.GGUFReader(path)
    dense = experts = 0
    for tensor in reader.tensors:
        if tensor.name == "token_embd.weight":
            continue
        if "_exps." in tensor.name:
            experts += int(tensor.n_bytes)
        else:
            dense += int(tensor.n_bytes)
    active = experts * SHAPE["top_k"] // SHAPE["experts"]
    return {
        "dense": dense,
        "all_experts": experts,
        "active_experts": active,
        "step": dense + active,
    }


# ---- the runs ----


def server(system: str, path: Path, port: int, args: argparse.Namespace) -> peers.PeerServer:
    if system == "ours":
        command = [
            str(Path(sys.executable).parent / "hetero-infer"), "serve",
            "--model", str(path), "--dtype", "bfloat16", "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port),
        ]  # fmt: skip
        return peers.PeerServer(
            "ours", command, "/readyz", MODEL, env=peers.server_env(args.threads)
        )
    users = max(args.users)
    per_request = args.prompt_len + args.output_len + peers.CTX_MARGIN
    command = [
        str(peers.llama_server_binary()), "--model", str(path), "--alias", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--threads", str(args.threads),
        "--parallel", str(users), "--ctx-size", str(users * per_request),
    ]  # fmt: skip
    return peers.PeerServer(
        "llama-server", command, "/health", MODEL, env=peers.server_env(args.threads),
        extra_body={"repeat_penalty": 1.0},
    )  # fmt: skip


def run_system(
    system: str, number: int, path: Path, args: argparse.Namespace, tokenizer: Any
) -> dict[str, Any]:
    """One system's round: started, one user's requests, then each larger user count's."""
    port = peers.free_port()
    peer = server(system, path, port, args)
    log_path = args.out / "logs" / f"moe-{system}-{number}.log"
    process = peers.start(peer, log_path)
    record: dict[str, Any] = {"command": peer.command, "load": os.getloadavg()[0]}
    try:
        base = f"http://127.0.0.1:{port}"
        record["ready_s"] = peers.wait_ready(
            process, base + peer.ready_path, peers.READY_TIMEOUT, log_path
        )
        for users in args.users:
            config = serving.BenchConfig(
                base_url=base + "/v1", model=peer.model,
                num_prompts=args.requests if users == 1 else 4 * users,
                prompt_len=args.prompt_len, output_len=args.output_len, concurrency=users,
                seed=args.seed + number, ignore_eos=True, extra_body=peer.extra_body,
                warmup=1, label=f"{system}-{users}",
            )  # fmt: skip
            result = serving.benchmark(config, tokenizer)
            speeds = [v for r in result["requests"] if (v := decode_tokens_per_s(r)) is not None]
            record[str(users)] = {
                "decode_tok_s": spread(speeds),
                "output_throughput": result["summary"]["output_throughput"],
                "failed": result["summary"]["failed"],
            }
            print(f"   {system} round {number}, {users} users: median decode "
                  f"{spread(speeds)['median']:.1f} tok/s, output "
                  f"{result['summary']['output_throughput']:.1f} tok/s", flush=True)  # fmt: skip
    finally:
        peers.stop(process)
    return record


def measure_read_bandwidth(threads: int) -> dict[str, float]:
    import torch

    from bench.roofline import measure_bandwidth

    torch.set_num_threads(threads)
    return measure_bandwidth(torch.device("cpu"), 1 << 30, 5)


def figure(record: dict[str, Any], users: int) -> float:
    """A system's figure in a round: one user's median decode tok/s, or with more users
    the output tok/s."""
    if users == 1:
        return record["1"]["decode_tok_s"]["median"]
    return record[str(users)]["output_throughput"]


def summarize(
    rounds: list[dict[str, Any]],
    users: list[int],
    step: dict[str, int],
    bandwidth: dict[str, float],
) -> dict[str, Any]:
    """Per user count: each system's per-round figure (one user: median decode tok/s;
    more: output tok/s), ours / llama-server per round, and their medians."""
    summary: dict[str, Any] = {}
    for n in users:
        key = str(n)
        per_round = {s: [figure(r[s], n) for r in rounds if s in r] for s in SYSTEMS}
        ratios = [figure(r["ours"], n) / figure(r["llama-server"], n)
                  for r in rounds if "ours" in r and "llama-server" in r]  # fmt: skip
        summary[key] = {
            "metric": "decode tok/s (1 / TPOT)" if n == 1 else "output tok/s",
            **per_round,
            "ratio_per_round": ratios,
            "ratio_median": statistics.median(ratios) if ratios else None,
        }
    ours_one = statistics.median(summary["1"]["ours"]) if "1" in summary else None
    if ours_one:
        summary["bandwidth_fraction"] = step["step"] * ours_one / (bandwidth["read_gbps"] * 1e9)
        summary["bandwidth_fraction_best"] = (
            step["step"] * ours_one / (bandwidth["read_gbps_best"] * 1e9)
        )
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--users", type=parse_ints, default=[1, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--requests", type=int, default=5, help="one user's requests")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    import transformers

    path = olmoe_gguf()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent / f"{MODEL}-tokenizer")
    step = step_bytes(path)
    bandwidth = measure_read_bandwidth(args.threads)
    size = path.stat().st_size / 1e9
    print(
        f"file {path} ({size:.2f} GB); a step reads {step['step'] / 1e6:.0f} MB; "
        f"read bandwidth {bandwidth['read_gbps']:.1f} GB/s",
        flush=True,
    )
    systems = args.systems.split(",")
    rounds = []
    for number in range(args.rounds):
        order = systems if number % 2 == 0 else systems[::-1]
        rounds.append({s: run_system(s, number, path, args, tokenizer) for s in order})
    summary = summarize(rounds, args.users, step, bandwidth)
    result = {
        "model": MODEL, "shape": SHAPE, "file": str(path.name), "threads": args.threads,
        "step_bytes": step, "bandwidth": bandwidth, "summary": summary, "rounds": rounds,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"moe-{MODEL}.json").write_text(json.dumps(portable(result), indent=1))
    print(json.dumps(portable(summary), indent=1))
    return result


if __name__ == "__main__":
    main()
