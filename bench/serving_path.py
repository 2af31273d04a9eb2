"""What the serving path costs: our server against our engine alone, same work.

    python -m bench.serving_path                       # 1 and 16 clients, 3 rounds
    python -m bench.serving_path --clients 1,16 --workload chat --rounds 3

For each client count C and round: ``LLMEngine.generate`` in this process on C
requests at once, then our server (``hetero-infer serve``, as bench/peers.py starts
it, on the same model and threads) with C streamed requests at once from
bench/serving.py's client; the same prompts (``--prompt-len`` token ids, the same
ids for both), ``--output-len`` tokens out with ``ignore_eos``, and the same sampling
(``--workload``: greedy, or the chat workload's temperature 0.7, top_p 0.95 and a seed
per request; the server's requests go to /v1/completions with the token ids as the
prompt, so that no chat template changes the work). Both are timed from the first
request sent to the last token received: output tokens per second. The server runs
``--requests-per-client`` requests per client in a row (C at a time), the engine the
same number of batches. Reported: each count's rates by round, their medians, and the
server / engine ratio per round and of the medians. Written to
``--out``/``serving-path-<workload>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import RESULTS_DIR, apply_engine_thread_settings, portable


def engine_rate(engine: Any, prompts: list[list[int]], params: list[Any], clients: int) -> float:
    """Output tok/s of the engine on the prompts, ``clients`` at a time."""
    started = time.perf_counter()
    tokens = 0
    for first in range(0, len(prompts), clients):
        batch = slice(first, first + clients)
        outputs = engine.generate(prompts[batch], params[batch], use_tqdm=False)
        tokens += sum(len(o.token_ids) for o in outputs)
    return tokens / (time.perf_counter() - started)


async def _stream_tokens(host: str, port: int, body: dict[str, Any]) -> int:
    """One streamed completion over a bare HTTP/1.1 connection; its completion tokens.

    The client shares the 2 cores with the server, so it does as little as it can: it
    writes the request, reads the response as bytes until the server closes the
    connection, and parses only the usage chunk at the end (an HTTP library's line
    and event parsing took a tenth of a core at 16 streams)."""
    import asyncio

    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + payload)
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"the server answered {status!r}")
    tail = b""
    while part := await reader.read(65536):
        tail = (tail + part)[-8192:]
    writer.close()
    usage = [line for line in tail.split(b"\n") if line.startswith(b'data: {"id"')][-1]
    return json.loads(usage[6:])["usage"]["completion_tokens"]


async def _server_run(base_url: str, prompts: list[list[int]], bodies: list[dict], clients: int):
    import asyncio
    from urllib.parse import urlsplit

    url = urlsplit(base_url)
    semaphore = asyncio.Semaphore(clients)

    async def limited(i: int) -> int:
        payload = {**bodies[i], "prompt": prompts[i], "stream": True}
        payload["stream_options"] = {"include_usage": True}
        async with semaphore:
            return await _stream_tokens(url.hostname, url.port, payload)

    started = time.perf_counter()
    counts = await asyncio.gather(*(limited(i) for i in range(len(prompts))))
    return sum(counts) / (time.perf_counter() - started)


def server_rate(base_url: str, prompts: list[list[int]], bodies: list[dict], clients: int) -> float:
    import asyncio

    return asyncio.run(_server_run(base_url, prompts, bodies, clients))


def sampling_fields(workload: str, index: int, seed: int) -> dict[str, Any]:
    from bench.serving import CHAT_SAMPLING

    if workload == "chat":
        return {**CHAT_SAMPLING, "seed": seed * 100_000 + index}
    return {"temperature": 0.0}


def summarize(engine: list[float], server: list[float]) -> dict[str, Any]:
    return {
        "engine_tok_s": engine,
        "server_tok_s": server,
        "median_engine_tok_s": statistics.median(engine),
        "median_server_tok_s": statistics.median(server),
        "server_to_engine_by_round": [s / e for s, e in zip(server, engine, strict=True)],
        "server_to_engine": statistics.median(server) / statistics.median(engine),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2 Q4_1")
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--workload", choices=("greedy", "chat"), default="chat")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--output-len", type=int, default=96)
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.clients.split(",")]

    apply_engine_thread_settings()
    import torch
    from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams, apply_process_settings
    from hetero_infer.engine.loader import default_model_path

    from bench import peers
    from bench.throughput import machine_info

    torch.set_num_threads(args.threads)
    model = args.model or str(default_model_path())
    config = EngineConfig(model=model, dtype="bfloat16", max_num_seqs=max(counts))
    apply_process_settings(config)
    engine = LLMEngine(config)
    vocab = engine.model_config.vocab_size
    rng = torch.Generator().manual_seed(args.seed)

    port = peers.free_port()
    # The embedded file (bench.peers' "gguf" for smollm2 is it), or --model.
    flags = argparse.Namespace(
        threads=args.threads,
        ours_model="gguf",
        gguf_dtype="q4_1",
        ours_flags=shlex.join(["--model", model]) if args.model else "",
    )
    server = peers.peer_ours("smollm2", port, flags)
    log_path = args.out / "logs" / "serving-path-server.log"
    process = peers.start(server, log_path)
    rates: dict[int, dict[str, list[float]]] = {c: {"engine": [], "server": []} for c in counts}
    loads = []
    try:
        base = f"http://127.0.0.1:{port}"
        peers.wait_ready(process, base + server.ready_path, peers.READY_TIMEOUT, log_path)
        for round_index in range(args.rounds):
            loads.append(os.getloadavg()[0])
            for clients in counts:
                n = clients * args.requests_per_client
                prompts = torch.randint(100, vocab, (n, args.prompt_len), generator=rng).tolist()
                fields = [
                    sampling_fields(args.workload, i, args.seed + round_index) for i in range(n)
                ]
                params = [
                    SamplingParams(max_tokens=args.output_len, ignore_eos=True, **f) for f in fields
                ]
                bodies = [
                    {"model": "smollm2", "max_tokens": args.output_len, "ignore_eos": True, **f}
                    for f in fields
                ]
                # Alternate which goes first, so that neither always meets a warmer machine.
                order = ("engine", "server") if round_index % 2 == 0 else ("server", "engine")
                for side in order:
                    if side == "engine":
                        rate = engine_rate(engine, prompts, params, clients)
                    else:
                        rate = server_rate(base + "/v1", prompts, bodies, clients)
                    rates[clients][side].append(rate)
                    print(
                        f"round {round_index + 1} clients {clients:3d} {side:6s} {rate:8.1f} tok/s",
                        flush=True,
                    )
    finally:
        peers.stop(process)
    result = {
        "benchmark": "serving_path",
        "command": "python -m bench.serving_path "
        + shlex.join(argv if argv is not None else sys.argv[1:]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": machine_info(),
        "load_average_per_round": loads,
        "clients": {str(c): summarize(rates[c]["engine"], rates[c]["server"]) for c in counts},
    }
    for clients, record in result["clients"].items():
        by_round = ", ".join(f"{x:.2f}" for x in record["server_to_engine_by_round"])
        print(
            f"{clients} clients: engine {record['median_engine_tok_s']:.1f}, server "
            f"{record['median_server_tok_s']:.1f} tok/s: server / engine "
            f"{record['server_to_engine']:.2f} (rounds {by_round})"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"serving-path-{args.workload}.json"
    path.write_text(json.dumps(portable(result), indent=1) + "\n")
    print(f"written: {path}")
    return result


if __name__ == "__main__":
    main()
