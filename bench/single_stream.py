"""Single-stream decode speed: our server and llama.cpp's own ``llama-server``, one
request at a time, on the same GGUF file; ``llama-bench`` on that file beside them.

    python -m bench.single_stream                                  # 3 rounds x 5 requests
    python -m bench.single_stream --rounds 5 --ours-flags "--quantization none"
    python -m bench.single_stream --ours-model folder --ours-flags "--dtype float32"
    python -m bench.single_stream --systems ours --no-llama-bench
    python -m bench.single_stream --gguf-dtype q8_0                # SmolLM2 requantized
    python -m bench.single_stream --model qwen2.5-0.5b-shape --gguf-dtype q4_1
    python -m bench.single_stream --model gemma-3-270m            # its packaged Q4_K_M

Each system's server is started as bench/peers.py starts it (same command, thread
environment, readiness check, stop), on 127.0.0.1, and sent ``--requests`` streamed
completions one after another (concurrency 1, after ``--warmup`` unmeasured ones):
a ``--prompt-len`` (64) token prompt, ``--output-len`` (128) tokens with
``ignore_eos`` (both servers take it), greedy. The client is bench/serving.py's.

- ``ours``: ``hetero-infer serve --dtype bfloat16`` as in bench/peers.py, with
  ``--model`` the same GGUF as llama-server's (``--ours-model gguf``, the default;
  whatever ``--gguf-dtype``; its quantized weights stay quantized where a kernel
  takes them) or the benchmark model's folder (``--ours-model folder``: safetensors of
  SmolLM2's dequantized weights, or the float weights the Qwen-shape GGUF was written
  from), then ``--ours-flags`` (later flags win: ``"--dtype float32"``,
  ``"--quantization none"``).
- ``llama-server``: bench/peers.py's peer (``bash bench/setup_llama_server.sh``
  builds it; skipped, with a line saying so, when missing): one slot, ``--threads``.

The GGUF (``--gguf-dtype``, bench/peers.py's ``llama_gguf``, written once by
bench/gguf_files.py): for ``smollm2`` the embedded Q4_1 file (q4_1, the default),
requantized to Q8_0 (q8_0) or dequantized to BF16/F16; for ``qwen2.5-0.5b-shape``
its folder as a qwen2 GGUF with the linear weights in Q4_1 (the tied embedding in
Q8_0, as llama-quantize would store it), Q8_0, BF16 or F16; for ``gemma-3-270m`` its
packaged Q4_K_M file as it is (q4_k_m, its default and only type), which has no folder
(``--ours-model gguf`` only), the clients tokenizing with the file's own tokenizer.

Decode speed of a request: output tokens after the first over the time after the
first token, from the stream: ``1 / TPOT`` = ``(n - 1) / (e2e - ttft)``. Rounds run
the systems interleaved (ours, llama-server, llama-bench, ours, ...), each round
restarting each server and sending new prompts (the seed plus the round), so that a
shared machine whose speed drifts slows them alike. ``llama-bench -m FILE -t THREADS
-p PROMPT_LEN -n OUTPUT_LEN`` runs once a round (its output kept as it printed it,
its pp and tg tokens/s parsed out). Reported per system: each round's median, the
median over all requests, their p25-p75 and min-max; llama-bench's tg per round;
ours / each peer per round (of the round medians) with the spread of those ratios,
and overall (of the pooled medians); the 1-minute load average as each round began.
Two threads on a 2-core machine that other work shares are fragile: llama.cpp's
threads meet at a barrier after every graph node, so a core taken away stalls each
token (compare ``--threads 1``).

``--workload chat`` sends bench/serving.py's sampled chat requests instead of greedy
completions (temperature 0.7, top_p 0.95, a seed per request).

Written to ``--out``: ``single-stream-<model>-<gguf dtype>-<workload>.json``
(everything: commands, every request, llama-bench's output, machine and load) and the
server logs under ``logs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import numpy as np

from bench import llama_bench, peers, serving
from bench.common import RESULTS_DIR, align, column_widths, portable
from bench.models import BENCH_MODELS, model_folder, tokenizer_folder
from bench.throughput import machine_info

SYSTEMS = ("ours", "llama-server")


# ---- numbers (pure functions, tested on made-up records) ----


def decode_tokens_per_s(request: dict[str, Any]) -> float | None:
    """A finished request's decode speed: tokens after the first over the time after
    the first token (1 / TPOT); None for a failed request or fewer than two tokens."""
    if not request.get("success"):
        return None
    tpot = serving.time_per_output_token(
        request.get("e2e"), request.get("ttft"), request.get("output_tokens", 0)
    )
    return 1.0 / tpot if tpot else None


def spread(values: list[float]) -> dict[str, Any]:
    """Median, p25, p75, min and max of ``values`` (None each when empty), and n."""
    if not values:
        return {"n": 0, "median": None, "p25": None, "p75": None, "min": None, "max": None}
    arr = np.asarray(values, dtype=np.float64)
    return {
        "n": len(values),
        "median": float(np.median(arr)),
        "p25": float(np.percentile(arr, 25)),
        "p75": float(np.percentile(arr, 75)),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def round_record(result: dict[str, Any], ready_s: float) -> dict[str, Any]:
    """One system's round from bench.serving's result: each request's decode tok/s
    and TTFT, their median, and what went wrong."""
    requests = result["requests"]
    speeds = [s for r in requests if (s := decode_tokens_per_s(r)) is not None]
    summary = result["summary"]
    return {
        "ready_s": ready_s,
        "decode_tok_s": speeds,
        "median_decode_tok_s": spread(speeds)["median"],
        "ttft_ms": [r["ttft"] * 1000 for r in requests if r.get("success")],
        "output_tokens": [r["output_tokens"] for r in requests if r.get("success")],
        "failed": summary["failed"],
        "short_outputs": summary["short_outputs"],
        "errors": summary["errors"],
    }


def system_record(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A system over all its rounds: every request's decode tok/s pooled."""
    pooled = [s for r in rounds for s in r["decode_tok_s"]]
    ttft = [t for r in rounds for t in r["ttft_ms"]]
    return {
        "rounds": rounds,
        "decode_tok_s": spread(pooled),
        "ttft_ms": spread(ttft),
        "failed": sum(r["failed"] for r in rounds),
        "short_outputs": sum(r["short_outputs"] for r in rounds),
    }


def ratios(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """ours / peer in decode tok/s: per round (of the round medians, the rounds both
    ran), overall (of the pooled medians), and the spread of the per-round ones."""
    theirs_by_round = {r["round"]: r["median_decode_tok_s"] for r in peer["rounds"]}
    return _ratios(ours, theirs_by_round, peer["decode_tok_s"]["median"])


def _ratios(
    ours: dict[str, Any], theirs_by_round: dict[int, float | None], theirs: float | None
) -> dict[str, Any]:
    by_round = {}
    for r in ours["rounds"]:
        other = theirs_by_round.get(r["round"])
        if r["median_decode_tok_s"] and other:
            by_round[r["round"]] = r["median_decode_tok_s"] / other
    mine = ours["decode_tok_s"]["median"]
    return {
        "by_round": by_round,
        "overall": mine / theirs if mine and theirs else None,
        "rounds": spread(list(by_round.values())),
    }


def llama_bench_record(runs: list[dict[str, Any]], output_len: int) -> dict[str, Any]:
    """llama-bench over the rounds: each run, its tg tokens/s by round and their spread;
    the first run's record alone when it was skipped."""
    if "skipped" in runs[0]:
        return runs[0]
    tg = f"tg{output_len}"
    by_round = {r["round"]: r["tests"][tg]["tok_s"] for r in runs if tg in r.get("tests", {})}
    return {
        "command": runs[0]["command"],
        "runs": runs,
        "tg_by_round": by_round,
        "tg_tok_s": spread(list(by_round.values())),
        "errors": [r for r in runs if "error" in r],
    }


# ---- running ----


def ours_flags(args: argparse.Namespace, gguf: Path) -> str:
    """bench.peers' ``--ours-flags`` for ours: the model, then the user's flags."""
    # Not given (None): the GGUF, this benchmark's default.
    model = model_folder(args.model) if args.ours_model == "folder" else gguf
    return shlex.join(["--model", str(model)]) + " " + args.ours_flags


def run_round(system: str, number: int, args: argparse.Namespace, tokenizer: Any) -> dict[str, Any]:
    """Start ``system``'s server, send the round's requests one at a time, stop it."""
    port = peers.free_port()
    peer = peers.PEER_BUILDERS[system](args.model, port, args)  # Skip when not built
    log_path = args.out / "logs" / f"single-stream-{args.model}-{system}-{number}.log"
    process = peers.start(peer, log_path)
    try:
        base = f"http://127.0.0.1:{port}"
        ready_s = peers.wait_ready(process, base + peer.ready_path, peers.READY_TIMEOUT, log_path)
        config = serving.BenchConfig(
            base_url=base + "/v1",
            model=peer.model,
            num_prompts=args.requests,
            prompt_len=args.prompt_len,
            output_len=args.output_len,
            concurrency=1,
            seed=args.seed + number,  # new prompts each round, the same for every system
            ignore_eos=peer.ignore_eos,
            extra_body=peer.extra_body,
            warmup=args.warmup,
            workload=args.workload,
            label=system,
        )
        result = serving.benchmark(config, tokenizer)
    finally:
        peers.stop(process)
    record = round_record(result, ready_s)
    record.update(round=number, command=peer.command, notes=peer.notes, log=log_path.name)
    return record


def run_llama_bench(args: argparse.Namespace, gguf: Path) -> dict[str, Any]:
    """llama-bench on ``gguf`` with the run's threads and lengths (bench/llama_bench.py)."""
    return llama_bench.run(gguf, args.threads, args.prompt_len, args.output_len)


# ---- the report ----


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(result: dict[str, Any]) -> str:
    """Decode tok/s per system and round, the pooled median and spread, ours / peer,
    llama-bench's tg per round, the load of each round; a skipped or failed system is
    a line saying so."""
    systems = result["systems"]
    s = result["settings"]
    n_rounds = s["rounds"]
    header = (
        "system", *(f"round {i}" for i in range(1, n_rounds + 1)),
        "median", "p25-p75", "min-max", "TTFT ms",
    )  # fmt: skip
    rows = []
    notes = []

    def row(
        name: str, by_round: dict[int, float | None], stats: dict, digits: int, ttft: str = ""
    ) -> tuple[str, ...]:
        return (
            name,
            *(_num(by_round.get(i), digits) for i in range(1, n_rounds + 1)),
            _num(stats["median"], digits),
            f"{_num(stats['p25'], digits)}-{_num(stats['p75'], digits)}",
            f"{_num(stats['min'], digits)}-{_num(stats['max'], digits)}",
            ttft,
        )

    for name, record in systems.items():
        if "rounds" not in record:
            notes.append(f"{name}: {record.get('skipped') or 'failed: ' + record['error']}")
            continue
        by_round = {r["round"]: r["median_decode_tok_s"] for r in record["rounds"]}
        rows.append(
            row(name, by_round, record["decode_tok_s"], 1, _num(record["ttft_ms"]["median"]))
        )
        if record["failed"] or record["short_outputs"]:
            notes.append(
                f"{name}: {record['failed']} failed requests, {record['short_outputs']} "
                "ended before max_tokens"
            )
        if "error" in record:
            notes.append(f"{name}: failed in a round: {record['error']}")
    bench = result.get("llama_bench")
    tg = f"tg{s['output_len']}"
    if bench and "runs" in bench:
        rows.append(row(f"llama-bench {tg}", bench["tg_by_round"], bench["tg_tok_s"], 1))
    for peer, ratio in result["ratios"].items():
        rows.append(row(f"ours/{peer}", ratio["by_round"], ratio["rounds"], 3))
        notes_overall = f"ours/{peer}: {_num(ratio['overall'], 3)} of the pooled medians"
        notes.append(notes_overall)
    loads = result.get("round_load") or []
    if loads:
        by_round = {i + 1: x for i, x in enumerate(loads)}
        rows.append(row("load avg 1 min", by_round, spread(loads), 2))
    widths = column_widths([header, *rows])

    def line(cells: tuple[str, ...]) -> str:
        return " ".join(align(cells, widths)).rstrip()

    lines = [line(header), "-" * len(line(header)), *(line(r) for r in rows)]
    lines.append(
        f"decode tok/s of single requests ({s['prompt_len']} prompt -> {s['output_len']} "
        f"tokens, {s['threads']} threads): each round's median, then over all "
        f"{s['requests']} x {n_rounds} requests; ratios per round, then their spread"
    )
    if bench and "runs" in bench:
        pp = f"pp{s['prompt_len']}"
        listed = ", ".join(
            f"{r['tests'][pp]['tok_s']:.1f}" for r in bench["runs"] if pp in r.get("tests", {})
        )
        lines.append(
            f"llama-bench: {shlex.join(bench['command'])}"
            + (f"; {pp} t/s by round: {listed}" if listed else "")
        )
        notes += [f"llama-bench round {r['round']}: {r['error']}" for r in bench["errors"]]
    elif bench:
        lines.append(f"llama-bench: {bench.get('skipped') or 'failed: ' + bench['error']}")
    return "\n".join(lines + notes)


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.single_stream", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="smollm2", choices=BENCH_MODELS)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"from {','.join(SYSTEMS)}")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--requests", type=int, default=5, help="per system and round")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured requests per round")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workload", choices=serving.WORKLOADS, default="greedy")
    parser.add_argument(
        "--gguf-dtype",
        default=None,
        choices=peers.GGUF_DTYPES,
        help="the GGUF served; default: q4_1 (gemma-3-270m: q4_k_m, its packaged file)",
    )
    parser.add_argument(
        "--ours-model",
        default=None,
        choices=("gguf", "folder"),
        help="ours loads the same GGUF as llama-server (the default), or the benchmark "
        "model's folder",
    )
    parser.add_argument(
        "--ours-flags", default="", help='more `hetero-infer serve` flags: "--quantization none"'
    )
    parser.add_argument("--no-llama-bench", action="store_true", help="do not run llama-bench")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns (and writes) the full result."""
    parser = build_parser()
    args = parser.parse_args(argv)
    systems = [s for s in args.systems.split(",") if s]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"--systems: unknown {unknown}; choose from {SYSTEMS}")
    if args.rounds < 1 or args.requests < 1:
        parser.error("--rounds and --requests: at least 1")
    peers.resolve_file_args(parser, args, default_dtype="q4_1", default_ours_model="gguf")
    gguf, _ = peers.llama_gguf(args.model, args.gguf_dtype)
    user_flags = args.ours_flags
    args.ours_flags = ours_flags(args, gguf)  # what bench.peers' ours builder reads
    args.concurrency = 1  # llama-server: one slot
    tokenizer = serving.load_tokenizer(str(tokenizer_folder(args.model)))
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.model}: {args.gguf_dtype} GGUF {gguf.name}; {args.requests} requests x "
        f"{args.prompt_len} tokens -> {args.output_len} tokens per round, one at a time, "
        f"{args.rounds} rounds, {args.threads} threads",
        flush=True,
    )
    load_before = os.getloadavg()
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    records: dict[str, dict[str, Any]] = {}
    bench_runs: list[dict[str, Any]] = []
    round_load = []
    for number in range(1, args.rounds + 1):
        round_load.append(os.getloadavg()[0])
        for system in systems:
            if system in records:  # skipped: no use trying again
                continue
            print(
                f"== {system} (round {number} of {args.rounds}, load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
            try:
                record = run_round(system, number, args, tokenizer)
            except peers.Skip as exc:
                records[system] = {"skipped": f"skipped: {exc}"}
                print(f"  {records[system]['skipped']}", flush=True)
                continue
            except RuntimeError as exc:  # did not start, or a warm-up request failed
                record = {"round": number, "error": str(exc)[-1000:]}
                print(f"  failed: {record['error']}", flush=True)
                rounds[system].append(record)
                continue
            rounds[system].append(record)
            listed = ", ".join(f"{x:.1f}" for x in record["decode_tok_s"])
            print(
                f"  ready in {record['ready_s']:.1f} s; decode tok/s {listed} "
                f"(median {_num(record['median_decode_tok_s'])})",
                flush=True,
            )
        if not args.no_llama_bench and not (bench_runs and "skipped" in bench_runs[0]):
            # In the same rounds: the machine's state of the moment shows in it too.
            print(f"== llama-bench (round {number} of {args.rounds})", flush=True)
            run = {**run_llama_bench(args, gguf), "round": number}
            bench_runs.append(run)
            print(run.get("output") or run.get("skipped") or run["error"], flush=True)
    for system in systems:
        if system in records:
            continue
        ran = [r for r in rounds[system] if "error" not in r]
        if ran:
            records[system] = system_record(ran)
            errors = [r["error"] for r in rounds[system] if "error" in r]
            if errors:
                records[system]["error"] = errors[0]
        else:
            records[system] = {"error": rounds[system][0]["error"]}
    llama_bench = llama_bench_record(bench_runs, args.output_len) if bench_runs else None
    ratio = {}
    if "rounds" in records.get("ours", {}):
        for system, record in records.items():
            if system != "ours" and "rounds" in record:
                ratio[system] = ratios(records["ours"], record)
        if llama_bench and "runs" in llama_bench:
            ratio["llama-bench"] = _ratios(
                records["ours"], llama_bench["tg_by_round"], llama_bench["tg_tok_s"]["median"]
            )

    result = {
        "command": shlex.join(
            ["python", "-m", "bench.single_stream", *(sys.argv[1:] if argv is None else argv)]
        ),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {**machine_info(), "load_before": load_before, "load_after": os.getloadavg()},
        "settings": {
            "model": args.model,
            "gguf": gguf.name,
            "gguf_dtype": args.gguf_dtype,
            "workload": args.workload,
            "rounds": args.rounds,
            "requests": args.requests,
            "warmup": args.warmup,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "threads": args.threads,
            "seed": args.seed,
            "ours_model": args.ours_model,
            "ours_flags": user_flags,
        },
        "systems": records,
        "ratios": ratio,
        "llama_bench": llama_bench,
        "round_load": round_load,
    }
    result["table"] = format_table(result)
    print()
    print(result["table"])
    path = args.out / f"single-stream-{args.model}-{args.gguf_dtype}-{args.workload}.json"
    path.write_text(json.dumps(portable(result), indent=1) + "\n")
    print(f"\nwritten: {path}")
    return result


if __name__ == "__main__":
    main()
