"""Serve one model with each peer in turn and run the serving benchmark on every one.

    python -m bench.peers                                   # smollm2, all peers
    python -m bench.peers --peers ours,llama-cpp --concurrency 16 --threads 2
    python -m bench.peers --quick                           # a small run, for a check
    python -m bench.peers --peers ours,llama-server --gguf-dtype q4_1
    python -m bench.peers --model qwen2.5-0.5b-shape --peers ours,llama-server --gguf-dtype q8_0
    python -m bench.peers --model gemma-3-270m --peers ours,llama-server --workload chat

For each peer: start its server on 127.0.0.1 on a free port, poll until it is ready,
run ``bench.serving`` against it (same prompts, same seed), stop it (SIGTERM, then
kill), and at the end print one comparison table with the ratio of ours to each peer,
written with a JSON and a PNG to ``--out`` (``peers-<model>.*``, plus each peer's own
``<model>-<peer>.json/.png`` and its server log under ``logs/``).

Peers, all on the same weights (``bench.models``) and the same number of threads
(``OMP_NUM_THREADS`` for the torch servers, ``n_threads`` for llama.cpp):

- ``ours``: ``hetero-infer serve --dtype bfloat16``, then ``--ours-flags`` (a later
  flag wins: ``--ours-flags "--dtype float32"``, ``"--model path/to.gguf"``).
- ``transformers``: ``transformers serve --continuous-batching --dtype bfloat16``. It
  refuses fields it does not know (``ignore_eos`` is a 422), so its requests carry a
  ``generation_config`` with ``eos_token_id: -1`` instead, which turns its eos stop
  off. It pins the model: requests name the model folder, as it was started with.
- ``llama-cpp``: llama.cpp through ``llama-cpp-python``'s server, installed in its own
  virtualenv by ``bench/setup_llama_cpp.sh`` (skipped when missing). Its weights are a
  GGUF of the model (``--gguf-dtype``, bench/gguf_files.py, written once next to the
  benchmark models). smollm2: the embedded Q4_1 file rewritten with every tensor
  dequantized to BF16 (the default; the same values ours and transformers compute
  with, whose folder comes from that GGUF too) or F16, requantized to Q8_0, or the
  Q4_1 file as it is. qwen2.5-0.5b-shape: its folder written as a qwen2 GGUF, linear
  weights in BF16 (as ours and transformers round the folder's), F16, Q8_0 or Q4_1
  (its tied embedding then in Q8_0). gemma-3-270m: the packaged Q4_K_M file as it is
  (``--gguf-dtype q4_k_m``, its default and only type: no conversion), which ours
  serves too (``--ours-model gguf``, its default); transformers, which loads a folder,
  is skipped. llama-cpp-python's server has no parallel slots: one request is
  computed at a time (``interrupt_requests`` off, as its default would cut a stream
  short whenever the next request arrives), so at any concurrency it measures
  sequential serving. It has no ``ignore_eos``;
  ``min_tokens = max_tokens`` keeps eos away (a Python logits processor, a small cost
  per token); its default ``repeat_penalty`` of 1.1 is set to 1 (greedy as the
  others); it sends no usage, so its output tokens are counted from the stream.
- ``llama-server``: llama.cpp's own C++ server, built by ``bench/setup_llama_server.sh``
  into ``.venv-peers/llama-server/bin`` (skipped when missing), on the same GGUF as
  ``llama-cpp`` (``--gguf-dtype``). ``--parallel`` slots as many as the concurrency
  (continuous batching across them), ``--ctx-size`` that many times the context one
  request needs (each slot gets its share), ``--threads``; its ``/v1/completions``
  takes ``ignore_eos`` and sends usage. Ready when ``/health`` answers 200. For a GGUF
  that carries no chat template where the engine gives its family one (Gemma's files:
  engine/models/chat_templates/gemma.jinja), it gets that template file
  (``--chat-template-file``), so that both servers format a chat alike.

The client's tokenizer (prompts, token counts) is the benchmark model's folder's, or a
GGUF model's file's own (bench.models.tokenizer_folder).

A peer that cannot run here is skipped with a line under the table saying why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import httpx

from bench import gguf_files, llama_bench, serving
from bench.common import REPO_ROOT, RESULTS_DIR, portable, thread_env
from bench.models import BENCH_MODELS, GGUF_MODELS, model_folder, packaged_gguf, tokenizer_folder

PEERS = ("ours", "transformers", "llama-cpp", "llama-server")
# The GGUFs llama.cpp is given (--gguf-dtype): smollm2 and qwen2.5-0.5b-shape are
# written in the first five; a GGUF benchmark model (gemma-3-270m) comes in its own
# file's type alone (q4_k_m).
GGUF_DTYPES = ("bf16", "f16", "q8_0", "q4_1", "q4_0", "q4_k_m")
WRITTEN_DTYPES = GGUF_DTYPES[:5]
LLAMA_CPP_VENV = REPO_ROOT / ".venv-peers" / "llama-cpp"
LLAMA_SERVER_BIN = REPO_ROOT / ".venv-peers" / "llama-server" / "bin"
# Tokens of room in a llama.cpp context beyond prompt + output (a BOS, a prompt that
# re-encodes a few tokens longer than asked for).
CTX_MARGIN = 64
READY_TIMEOUT = 900.0  # seconds; a first start converts weights on a busy 2-core machine
STOP_TIMEOUT = 60.0


@dataclass
class PeerServer:
    """How to start one peer and how to talk to it."""

    name: str
    command: list[str]
    ready_path: str  # GET returns 200 once the model is loaded
    model: str  # the model name its requests carry
    env: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Skip(Exception):
    """A peer that cannot run here (not installed, no weights for it)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_env(threads: int) -> dict[str, str]:
    """Environment that holds a server to ``threads`` threads: torch (OpenMP, MKL) and
    numpy (OpenBLAS), whose pool would otherwise take every core."""
    return {**thread_env(threads), "OPENBLAS_NUM_THREADS": str(threads)}


# ---- the GGUF for llama.cpp ----


def llama_cpp_python() -> Path:
    """The interpreter of the llama-cpp-python virtualenv, if its server imports."""
    python = LLAMA_CPP_VENV / "bin" / "python"
    if not python.is_file():
        raise Skip(
            f"llama-cpp-python is not installed ({python} missing): run "
            "`bash bench/setup_llama_cpp.sh`"
        )
    check = subprocess.run(
        [str(python), "-c", "import llama_cpp, llama_cpp.server; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        raise Skip(
            f"llama-cpp-python does not import in {LLAMA_CPP_VENV} ({last}): run "
            "`bash bench/setup_llama_cpp.sh`"
        )
    return python


def llama_server_binary(name: str = "llama-server") -> Path:
    """llama.cpp's ``llama-server`` (or ``llama-bench``) as built by
    ``bench/setup_llama_server.sh``, if it is there and runs."""
    path = LLAMA_SERVER_BIN / name
    if not path.is_file():
        raise Skip(f"{name} is not built ({path} missing): run `bash bench/setup_llama_server.sh`")
    check = subprocess.run(
        [str(path), "--help" if name == "llama-bench" else "--version"],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        last = ((check.stderr or check.stdout).strip().splitlines() or ["?"])[-1]
        raise Skip(f"{path} does not run ({last}): run `bash bench/setup_llama_server.sh`")
    return path


def llama_server_build() -> str:
    """Which build bench/setup_llama_server.sh installed: its source and whether the
    native build's AMX instructions were turned off (they fault on some machines)."""
    prefix = LLAMA_SERVER_BIN.parent
    files = [prefix / "SOURCE", prefix / "BUILD"]
    parts = [path.read_text().strip() for path in files if path.is_file()]
    return ", ".join(parts) or "not recorded (built before the setup script recorded it)"


def gguf_dtypes(model: str) -> tuple[str, ...]:
    """The --gguf-dtype values benchmark model ``model`` has a file in."""
    return (GGUF_MODELS[model][1],) if model in GGUF_MODELS else WRITTEN_DTYPES


def resolve_file_args(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    default_dtype: str,
    default_ours_model: str,
) -> None:
    """Fill in ``--gguf-dtype`` and ``--ours-model`` where not given: a GGUF benchmark
    model's own file type, and ours on that file; else the benchmark's defaults.
    ``parser.error`` (exit 2) for a type the model has no file in, or a folder for
    ours where the model has none."""
    if args.gguf_dtype is None:
        args.gguf_dtype = gguf_dtypes(args.model)[0] if args.model in GGUF_MODELS else default_dtype
    if args.gguf_dtype not in gguf_dtypes(args.model):
        if args.model in GGUF_MODELS:
            why = f"its packaged file is {gguf_dtypes(args.model)[0]} and is served as it is"
        else:
            why = "q4_k_m is gemma-3-270m's packaged file alone"
        parser.error(
            f"--gguf-dtype {args.gguf_dtype}: no such file of {args.model} ({why}); "
            f"choose from {', '.join(gguf_dtypes(args.model))}"
        )
    if args.ours_model is None:
        args.ours_model = "gguf" if args.model in GGUF_MODELS else default_ours_model
    if args.ours_model == "folder" and args.model in GGUF_MODELS:
        parser.error(f"--ours-model folder: {args.model} has no folder; ours serves its GGUF")


def llama_gguf(model: str, gguf_dtype: str) -> tuple[Path, str]:
    """The GGUF that the llama.cpp peers serve (``--gguf-dtype``) and a note on it;
    written on first use (bench/gguf_files.py), or a GGUF benchmark model's file."""
    if model in GGUF_MODELS:
        if gguf_dtype not in gguf_dtypes(model):
            raise ValueError(
                f"{model} comes as one {gguf_dtypes(model)[0]} GGUF file, not {gguf_dtype!r}"
            )
        path = packaged_gguf(model)
        # The others (ours) load it too: no "not the others' weights" here.
        return path, f"the packaged {gguf_dtype.upper()} GGUF as it is ({path.name})"
    if gguf_dtype not in WRITTEN_DTYPES:
        raise ValueError(f"no {gguf_dtype!r} GGUF of {model}; choose from {WRITTEN_DTYPES}")
    if model == "smollm2":
        from hetero_infer.engine.loader import default_model_path

        source = default_model_path()
        if gguf_dtype == "q4_1":
            path, what = source, f"the embedded Q4_1 GGUF as it is ({source.name})"
        else:
            path = gguf_files.rewritten_gguf(source, gguf_dtype)
            how = "requantized" if gguf_dtype in ("q8_0", "q4_0") else "dequantized"
            what = f"{path.name}: the embedded Q4_1 GGUF {how} to {gguf_dtype.upper()}"
    elif model == "qwen2.5-0.5b-shape":
        path = gguf_files.qwen2_gguf(model_folder(model), gguf_dtype)
        embedding = gguf_files.qwen2_tensor_type("token_embd.weight", 2, gguf_dtype).name
        what = (
            f"{path.name}: the benchmark folder as a GGUF, its linear weights in "
            f"{gguf_dtype.upper()}, the tied embedding in {embedding}"
        )
    else:
        raise Skip(f"no GGUF of {model!r}")
    if gguf_dtype in ("q8_0", "q4_1", "q4_0"):
        # ours and transformers load the folder's float weights unless told otherwise
        what += ": not the others' weights"
    return path, what


# ---- the peers ----


def peer_ours(model: str, port: int, args: argparse.Namespace) -> PeerServer:
    if model in GGUF_MODELS or getattr(args, "ours_model", "folder") == "gguf":
        weights = llama_gguf(model, args.gguf_dtype)[0]  # llama.cpp's file
    else:
        weights = model_folder(model)
    command = [
        str(Path(sys.executable).parent / "hetero-infer"), "serve",
        "--model", str(weights),
        "--dtype", "bfloat16",
        "--served-model-name", model,
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    # Appended: argparse keeps a flag's last value, so these override the ones above.
    extra = shlex.split(getattr(args, "ours_flags", "") or "")
    notes = [f"ours: extra flags {shlex.join(extra)}"] if extra else []
    return PeerServer(
        "ours", command + extra, "/readyz", model, env=server_env(args.threads), notes=notes
    )


def peer_transformers(model: str, port: int, args: argparse.Namespace) -> PeerServer:
    if model in GGUF_MODELS:
        raise Skip(f"transformers serve loads a model folder, and {model} is a GGUF file only")
    cli = Path(sys.executable).parent / "transformers"
    if not cli.is_file():
        raise Skip(f"transformers' CLI is not installed ({cli} missing)")
    folder = str(model_folder(model))
    command = [
        str(cli), "serve", "--continuous-batching",
        "--dtype", "bfloat16", "--device", "cpu",
        "--host", "127.0.0.1", "--port", str(port),
        "--log-level", "warning",
        folder,
    ]  # fmt: skip
    no_eos = {"eos_token_id": -1, "do_sample": False, "max_new_tokens": args.output_len}
    return PeerServer(
        "transformers",
        command,
        "/health",
        folder,  # it is pinned to the folder and refuses any other name
        env=server_env(args.threads),
        ignore_eos=False,
        extra_body={"generation_config": json.dumps(no_eos)},
        notes=["transformers: eos stop off through generation_config.eos_token_id = -1"],
    )


def peer_llama_cpp(model: str, port: int, args: argparse.Namespace) -> PeerServer:
    python = llama_cpp_python()
    gguf_path, weights = llama_gguf(model, args.gguf_dtype)
    # One sequence at a time: room for the longest request and a margin.
    n_ctx = max(2048, args.prompt_len + args.output_len + CTX_MARGIN)
    command = [
        str(python), "-m", "llama_cpp.server",
        "--model", str(gguf_path),
        "--model_alias", model,
        "--host", "127.0.0.1", "--port", str(port),
        "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
        "--n_ctx", str(n_ctx),
        "--interrupt_requests", "False",
    ]  # fmt: skip
    notes = []
    template = missing_chat_template(gguf_path)
    if template is not None and template.stem == "gemma":
        # Its own Gemma format: it takes no template file (else it falls back to Llama 2's).
        command += ["--chat_format", "gemma"]
        notes.append("llama-cpp: chat format gemma (llama-cpp-python's own)")
    return PeerServer(
        "llama-cpp",
        command,
        "/v1/models",
        model,
        env=server_env(args.threads),
        ignore_eos=False,
        # Its server's own defaults include repeat_penalty 1.1, which changes even
        # greedy picks: neutral, as the other peers run.
        extra_body={"min_tokens": args.output_len, "repeat_penalty": 1.0},
        notes=[
            f"llama-cpp weights: {weights}",
            "llama-cpp: llama-cpp-python's server computes one request at a time "
            "(no parallel slots); min_tokens = max_tokens stands in for ignore_eos; "
            "repeat_penalty 1 (its default is 1.1)",
            *notes,
        ],
    )


def peer_llama_server(model: str, port: int, args: argparse.Namespace) -> PeerServer:
    binary = llama_server_binary()
    gguf_path, weights = llama_gguf(model, args.gguf_dtype)
    slots = max(1, args.concurrency or 1)
    # Without a unified KV cache (the default when --parallel is given) every slot gets
    # ctx-size / slots: room for one request each.
    per_request = args.prompt_len + args.output_len + CTX_MARGIN
    command = [
        str(binary),
        "--model", str(gguf_path),
        "--alias", model,
        "--host", "127.0.0.1", "--port", str(port),
        "--threads", str(args.threads),
        "--parallel", str(slots),
        "--ctx-size", str(slots * per_request),
    ]  # fmt: skip
    template = missing_chat_template(gguf_path)
    if template is not None:
        command += ["--chat-template-file", str(template)]
    return PeerServer(
        "llama-server",
        command,
        "/health",
        model,
        env=server_env(args.threads),
        # Greedy with no penalty, whatever its defaults are in this release.
        extra_body={"repeat_penalty": 1.0},
        notes=[
            f"llama-server weights: {weights}",
            f"llama-server: {slots} slots of {per_request} tokens (continuous batching), "
            f"{args.threads} threads",
            f"llama-server build: {llama_server_build()}",
            *(
                [f"llama-server: chat template {template.name}, the one ours gives the file"]
                if template is not None
                else []
            ),
        ],
    )


def missing_chat_template(gguf_path: Path) -> Path | None:
    """The engine's own chat template file for a GGUF that carries none, where the
    engine gives the file's family one (Gemma's: engine/models/chat_templates/), so
    that llama-server formats chats as ours does; None otherwise (llama.cpp then uses
    the file's template)."""
    from hetero_infer.engine.loader.gguf_header import read_gguf_header
    from hetero_infer.engine.models import architectures

    # The engine's reader: gguf-py's builds an object per vocabulary entry (15 s on
    # Gemma's 262k).
    fields = read_gguf_header(gguf_path).fields
    if "tokenizer.chat_template" in fields:
        return None
    family = architectures.BY_GGUF_ARCH.get(fields["general.architecture"])
    if family is None or family.chat_template is None:
        return None
    return Path(architectures.__file__).parent / "chat_templates" / f"{family.chat_template}.jinja"


PEER_BUILDERS: dict[str, Callable[[str, int, argparse.Namespace], PeerServer]] = {
    "ours": peer_ours,
    "transformers": peer_transformers,
    "llama-cpp": peer_llama_cpp,
    "llama-server": peer_llama_server,
}


# ---- running a server ----


def start(peer: PeerServer, log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_")}
    env.update(peer.env)
    with open(log_path, "wb") as log:
        # Its own session: stop() can then reach the workers it spawns, too.
        return subprocess.Popen(
            peer.command,
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(process: subprocess.Popen, url: str, timeout: float, log_path: Path) -> float:
    """Poll ``url`` until it answers 200; returns the seconds it took."""
    started = time.monotonic()
    while True:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the server exited with {process.returncode}:\n{tail}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"not ready after {timeout:.0f} s (log: {log_path})")
        time.sleep(0.5)


def stop(process: subprocess.Popen, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (ours drains and exits), then SIGKILL to the whole group if it lingers."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # leftovers of the group, if any
    if process.poll() is None:
        process.wait(timeout=30)


def run_peer(
    name: str,
    args: argparse.Namespace,
    out: Path,
    tag: str = "",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Start peer ``name`` (with ``env`` added to its environment), benchmark it, stop
    it; raises Skip when it cannot run here. ``tag`` names the round in its files."""
    port = free_port()
    peer = PEER_BUILDERS[name](args.model, port, args)
    peer.env.update(env or {})
    log_path = out / "logs" / f"{args.model}-{name}{tag}.log"
    print(f"-- {name}: starting on port {port} (log {log_path})", flush=True)
    for note in peer.notes:
        print(f"   {note}", flush=True)
    process = start(peer, log_path)
    try:
        base = f"http://127.0.0.1:{port}"
        took = wait_ready(process, base + peer.ready_path, READY_TIMEOUT, log_path)
        print(f"-- {name}: ready after {took:.1f} s; benchmarking", flush=True)
        config = serving.BenchConfig.from_args(
            args,
            base_url=base + "/v1",
            model=peer.model,
            tokenizer=str(tokenizer_folder(args.model)),
            ignore_eos=peer.ignore_eos,
            extra_body=peer.extra_body,
            label=name,
        )
        result = serving.benchmark(config)
    finally:
        stop(process)
    result["peer"] = {
        "command": peer.command,
        "threads": args.threads,
        "notes": peer.notes,
        "ready_s": took,
    }
    print(serving.format_summary(result), flush=True)
    serving.write_result(result, out / "runs", f"{args.model}-{name}{tag}")
    return result


def rounds_summary(rounds: list[dict[str, Any]], baseline: str = "ours") -> dict[str, Any]:
    """Per peer: output tok/s in each round and their median; ours / each peer per
    round and of the medians (pure: tested on made-up rounds)."""
    names = list(dict.fromkeys(name for r in rounds for name in r["results"]))
    rates = {
        name: [r["results"][name]["output_throughput"] for r in rounds if name in r["results"]]
        for name in names
    }
    summary: dict[str, Any] = {
        name: {"output_tok_s": values, "median_output_tok_s": statistics.median(values)}
        for name, values in rates.items()
        if values
    }
    if baseline in summary:
        for name in summary:
            if name == baseline:
                continue
            per_round = [
                r["results"][baseline]["output_throughput"]
                / r["results"][name]["output_throughput"]
                for r in rounds
                if baseline in r["results"] and name in r["results"]
            ]
            summary[name]["ours_ratio_by_round"] = per_round
            summary[name]["ours_ratio_of_medians"] = (
                summary[baseline]["median_output_tok_s"] / summary[name]["median_output_tok_s"]
            )
    return summary


def write_rounds(
    args: argparse.Namespace, argv: list[str] | None, rounds: list[dict[str, Any]]
) -> Path:
    """The rounds and their summary as JSON: the command, the machine, the load average
    and llama-bench's tg of each round, every peer's summary."""
    from bench.throughput import machine_info

    summary = rounds_summary(rounds)
    name = f"peers-{args.model}-{args.workload}-{args.gguf_dtype}-c{args.concurrency}"
    path = args.out / f"{name}.json"
    argv = argv if argv is not None else sys.argv[1:]
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {
        "benchmark": "peers",
        "command": "python -m bench.peers " + shlex.join(argv),
        "settings": settings,
        "machine": machine_info(),
        "rounds": rounds,
        "summary": summary,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(portable(result), indent=1, default=str) + "\n")
    for peer, record in summary.items():
        ratios = record.get("ours_ratio_by_round")
        spread = f", ours / it by round {', '.join(f'{x:.2f}' for x in ratios)}" if ratios else ""
        print(f"{peer}: median {record['median_output_tok_s']:.1f} output tok/s{spread}")
    print(f"wrote {path}")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peers", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default="smollm2", choices=BENCH_MODELS)
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {PEERS}")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--request-rate", type=serving._rate, default=float("inf"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--workload", choices=serving.WORKLOADS, default="greedy")
    parser.add_argument(
        "--rounds", type=int, default=1, help="interleaved rounds (peer order rotates)"
    )
    parser.add_argument(
        "--ours-model",
        choices=("folder", "gguf"),
        default=None,
        help="ours serves the benchmark folder, or llama.cpp's GGUF (--gguf-dtype); "
        "default: folder (gemma-3-270m: gguf, it has no folder)",
    )
    parser.add_argument(
        "--llama-bench", action="store_true", help="llama-bench tg on the GGUF once a round"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--gguf-dtype",
        default=None,
        choices=GGUF_DTYPES,
        help="llama.cpp's weights; default: bf16 (gemma-3-270m: q4_k_m, its packaged file)",
    )
    parser.add_argument(
        "--ours-flags", default="", help='more `hetero-infer serve` flags, e.g. "--dtype float32"'
    )
    parser.add_argument("--quick", action="store_true", help="8 prompts of 64 tokens -> 16 tokens")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, ``--gguf-dtype`` and ``--ours-model`` filled in for the model."""
    parser = build_parser()
    args = parser.parse_args(argv)
    resolve_file_args(parser, args, default_dtype="bf16", default_ours_model="folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.num_prompts, args.prompt_len, args.output_len = 8, 64, 16
        args.concurrency = min(args.concurrency, 8)
    names = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = sorted(set(names) - set(PEERS))
    if unknown:
        print(f"error: unknown peers {unknown}; choose from {PEERS}", file=sys.stderr)
        return 2
    print(
        f"model {args.model}: {args.num_prompts} prompts x {args.prompt_len} tokens -> "
        f"{args.output_len} tokens, concurrency {args.concurrency}, {args.threads} threads",
        flush=True,
    )
    broken: list[str] = []
    skipped: dict[str, str] = {}
    rounds: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []  # the last round's, for the detailed comparison
    for number in range(1, args.rounds + 1):
        # New prompts each round, the same for every peer; the order rotates, so that
        # none always meets a warmer (or busier) machine.
        round_args = argparse.Namespace(**{**vars(args), "seed": args.seed + number - 1})
        shift = (number - 1) % len(names)
        record: dict[str, Any] = {"round": number, "load_average": os.getloadavg()[0]}
        results = []
        for name in names[shift:] + names[:shift]:
            if name in skipped or name in broken:
                continue
            tag = f"-r{number}" if args.rounds > 1 else ""
            try:
                results.append(run_peer(name, round_args, args.out, tag))
            except Skip as exc:  # not installed here: a line under the table, not a failure
                print(f"-- skipping {name}: {exc}", flush=True)
                skipped[name] = str(exc)
            except RuntimeError as exc:  # a peer that failed to start or serve: go on
                print(f"-- {name} failed: {exc}", flush=True)
                broken.append(name)
        record["results"] = {r["label"]: r["summary"] for r in results}
        if args.llama_bench:
            gguf, _ = llama_gguf(args.model, args.gguf_dtype)
            bench = llama_bench.run(gguf, args.threads, args.prompt_len, args.output_len)
            record["llama_bench"] = bench
            print(f"-- llama-bench: {llama_bench.tg(bench, args.output_len)} tok/s tg", flush=True)
        rounds.append(record)
    if rounds and any(r["results"] for r in rounds):
        write_rounds(args, argv, rounds)
    skip_lines = [f"note: {name} skipped: {why}" for name, why in skipped.items()]
    if not results:
        print("\n".join([*skip_lines, "no peer ran"]), file=sys.stderr)
        return 1
    baseline = "ours" if any(r["label"] == "ours" for r in results) else None
    table, paths = serving.write_comparison(results, args.out, f"peers-{args.model}", baseline)
    if skip_lines:  # the table file says so too
        with paths[1].open("a") as md:
            md.write("\n".join(skip_lines) + "\n")
    print()
    print(table)
    for result in results:
        for note in result["peer"]["notes"]:
            print(f"note: {note}")
    for line in skip_lines:
        print(line)
    for name in broken:
        print(f"note: {name} did not run (see its log)")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0 if not broken and all(r["summary"]["failed"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
