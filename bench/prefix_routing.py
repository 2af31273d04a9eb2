"""Routing by KV events against round-robin: two replicas behind the example router of
deploy/kv-routing, requests that share a few long prefixes.

    python -m bench.prefix_routing       # 4 prefixes of ~2,000 tokens, 32 requests, 3 rounds
    python -m bench.prefix_routing --requests 16 --prefix-tokens 1000 --rounds 2

Two replicas of the embedded SmolLM2 (Q4_1), each ``hetero-infer serve`` on
``--threads`` CPU threads (1) with a KV cache (the server's ``--max-num-blocks``) that
holds two of the prompts and ``--slack-blocks`` more: a replica that sees all the prefixes evicts
them in turn, one that sees two of them keeps both. They publish their KV events
(sha256_cbor block hashes, PYTHONHASHSEED=0) and start once; each phase (a policy in a
round; the order alternates by round) starts the router with its ``--policy``
(``events``: the replica holding the longest run of the prompt's leading blocks,
else the least loaded; ``round-robin``) and gets fresh prefixes of its own, so that no
phase finds another's blocks.

A phase's requests are chats: a system message of about ``--prefix-tokens`` tokens
(one of ``--prefixes`` distinct texts, unlike from their first words) and a short
question of the request's own, ``--max-tokens`` tokens out, streamed, one at a time.
First each prefix once (warm-up, in a seeded order), then ``--requests`` requests
spread evenly over the prefixes in a seeded random order. Measured on those:

- the prefix hit rate: prompt tokens found in the replicas' prefix caches over those
  looked up (``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total``
  from their /metrics, summed; the warm-up's reported apart);
- TTFT: from sending the request to the first chunk with text, through the router;
  its median, spread and mean, also split by whether the prompt's prefix was found.
  Round-robin finds about half of the prefixes, so its median falls between a hit's
  and a miss's time and jumps between rounds; its mean is the steadier comparison.

Written to ``--out``/``prefix-routing-<cpu>.json`` with the machine's CPU and flags.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench import peers
from bench.common import REPO_ROOT, RESULTS_DIR, portable
from bench.gpu_check import device_slug

ROUTER = REPO_ROOT / "deploy" / "kv-routing" / "router.py"
POLICIES = ("events", "round-robin")
MODEL = "smollm2"
# One per prefix (a phase's own): each opens its text, so that no two share a block.
TOPICS = [
    "astronomy", "baking", "chemistry", "diving", "economics", "falconry", "geology",
    "harbours", "irrigation", "jewellery", "knitting", "linguistics", "meteorology",
    "navigation", "orchards", "pottery", "quarrying", "railways", "sailing", "tanning",
    "upholstery", "viticulture", "weaving", "zoology", "beekeeping", "cartography",
    "dentistry", "forestry", "glassmaking", "horology", "lacemaking", "masonry",
]  # fmt: skip
SENTENCES = [
    "Answer in plain words and keep every reply under three sentences.",
    "When a question is unclear, say which reading you chose and why.",
    "Quote figures with their units and say where they come from.",
    "Never invent a source; say that you do not know instead.",
    "Prefer the older, established term over a new coinage.",
    "Give one worked example when the user asks how something is done.",
    "List at most five items, the most important first.",
    "Point out a safety risk before anything else in the answer.",
]


def system_text(topic: str, tokens: int, tokenizer: Any, rng: random.Random) -> str:
    """About ``tokens`` tokens of instructions on ``topic``, which opens the text (so
    that the prefixes part in their first block), the rules in an order of its own."""
    lines = [f"{topic.capitalize()} desk. You are the assistant of the {topic} desk."]
    while len(tokenizer.encode(" ".join(lines))) < tokens:
        lines.append(f"Rule {len(lines)} of the {topic} desk: {rng.choice(SENTENCES)}")
    return " ".join(lines)


def counters(url: str) -> dict[str, float]:
    """A replica's prompt tokens found in its prefix cache and looked up, so far."""
    names = {"vllm:prefix_cache_hits_total": "hits", "vllm:prefix_cache_queries_total": "queries"}
    totals = dict.fromkeys(names.values(), 0.0)
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in names:
                totals[names[sample.name]] += sample.value
    return totals


def totals(urls: list[str]) -> dict[str, float]:
    each = [counters(url) for url in urls]
    return {key: sum(c[key] for c in each) for key in ("hits", "queries")}


def streamed_chat(client: httpx.Client, system: str, question: str, max_tokens: int) -> dict:
    """One streamed chat through the router: TTFT, end-to-end time, where it went."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}
    body |= {"temperature": 0, "ignore_eos": True}
    started = time.perf_counter()
    ttft = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if ttft is None and line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                if delta.get("content"):
                    ttft = time.perf_counter() - started
    e2e = time.perf_counter() - started
    replica = response.headers["x-replica"]
    return {"ttft_s": ttft or e2e, "e2e_s": e2e, "replica": replica}


def summary(values: list[float]) -> dict[str, Any]:
    """Median, spread and mean of a phase's times."""
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {
        "count": len(values),
        "p50": statistics.median(values),
        "p10": pct(0.1),
        "p90": pct(0.9),
        "mean": statistics.fmean(values),
        "min": ordered[0],
        "max": ordered[-1],
    }


def run_phase(policy: str, texts: list[str], args: argparse.Namespace, ctx: dict) -> dict:
    """A fresh router with ``policy`` in front of the replicas, and the phase's requests."""
    urls, rng = ctx["urls"], random.Random(f"{args.seed}-{policy}-{ctx['round']}")
    port = peers.free_port()
    command = [sys.executable, str(ROUTER), "--policy", policy, "--port", str(port)]
    command += ["--tokenizer", ctx["tokenizer_path"]]
    for replica in ctx["replicas"]:
        command += ["--replica", replica]
    router = peers.PeerServer("router", command, "/health", MODEL, env={"PYTHONHASHSEED": "0"})
    log_path = args.out / "logs" / f"prefix-routing-router-{policy}.log"
    process = peers.start(router, log_path)
    try:
        base = f"http://127.0.0.1:{port}"
        peers.wait_ready(process, base + "/health", 120, log_path)
        with httpx.Client(base_url=base, timeout=600) as client:
            before = totals(urls)
            warmup = [
                streamed_chat(client, texts[k], f"Warm-up {k}: hello?", args.max_tokens)
                for k in rng.sample(range(len(texts)), len(texts))
            ]
            middle = totals(urls)
            order = [i % len(texts) for i in range(args.requests)]
            rng.shuffle(order)
            requests = []
            for i, k in enumerate(order):
                # Both replicas' counters: which one serves is known only afterwards.
                ahead = {url: counters(url) for url in urls}
                question = f"Question {i}: which rule matters most?"
                record = streamed_chat(client, texts[k], question, args.max_tokens)
                later = counters(record["replica"])
                found = {key: later[key] - ahead[record["replica"]][key] for key in later}
                requests.append({**record, "prefix": k, **found})
            after = totals(urls)
    finally:
        peers.stop(process)
    measured = {key: after[key] - middle[key] for key in after}
    warm = {key: middle[key] - before[key] for key in middle}
    # Found: most of the prompt came from the cache (a miss finds none of it).
    hit = [r["ttft_s"] for r in requests if r["hits"] >= r["queries"] / 2]
    miss = [r["ttft_s"] for r in requests if r["hits"] < r["queries"] / 2]
    result = {
        "policy": policy,
        "round": ctx["round"],
        "load_average": os.getloadavg()[0],
        "prefix_hit_rate": measured["hits"] / measured["queries"],
        "prefix_tokens": measured,
        "warmup_prefix_tokens": warm,
        "requests_finding_their_prefix": len(hit),
        "ttft_s": summary([r["ttft_s"] for r in requests]),
        "ttft_s_prefix_found": summary(hit),
        "ttft_s_prefix_not_found": summary(miss),
        "e2e_s": summary([r["e2e_s"] for r in requests]),
        "warmup_ttft_s": [r["ttft_s"] for r in warmup],
        "requests": requests,
    }
    print(
        f"{policy} (round {ctx['round']}): prefix hits {result['prefix_hit_rate']:.1%}, "
        f"{len(hit)}/{len(requests)} requests found their prefix; TTFT p50 "
        f"{result['ttft_s']['p50'] * 1e3:.0f} ms (p10 {result['ttft_s']['p10'] * 1e3:.0f}, "
        f"p90 {result['ttft_s']['p90'] * 1e3:.0f})",
        flush=True,
    )
    return result


def start_replicas(num_blocks: int, args: argparse.Namespace) -> tuple[list, list[str]]:
    """Both replicas loading side by side; their processes and --replica arguments."""
    processes, arguments = [], []
    for index in range(2):
        port, events, replay = peers.free_port(), peers.free_port(), peers.free_port()
        settings = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv"}
        settings |= {"endpoint": f"tcp://*:{events}", "replay_endpoint": f"tcp://*:{replay}"}
        command = [
            str(Path(sys.executable).parent / "hetero-infer"), "serve",
            "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port),
            # max_model_len: no more than the KV cache holds, which the server requires
            "--max-num-blocks", str(num_blocks), "--max-model-len", str(num_blocks * 16),
            "--prefix-caching-hash-algo", "sha256_cbor",
            "--kv-events-config", json.dumps(settings),
        ]  # fmt: skip
        env = {**peers.server_env(args.threads), "PYTHONHASHSEED": "0"}
        server = peers.PeerServer(f"replica{index}", command, "/readyz", MODEL, env=env)
        log_path = args.out / "logs" / f"prefix-routing-replica{index}.log"
        processes.append((peers.start(server, log_path), f"http://127.0.0.1:{port}", log_path))
        arguments.append(
            f"http://127.0.0.1:{port},tcp://127.0.0.1:{events},tcp://127.0.0.1:{replay}"
        )
    for process, url, log_path in processes:
        peers.wait_ready(process, url + "/readyz", peers.READY_TIMEOUT, log_path)
    return processes, arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefixes", type=int, default=4)
    parser.add_argument("--prefix-tokens", type=int, default=2000, help="about, each")
    parser.add_argument("--requests", type=int, default=32, help="measured, per phase")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="each replica's")
    parser.add_argument("--slack-blocks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder
    from hetero_infer.engine.loader.source import resolve_model
    from transformers import AutoTokenizer

    from bench.throughput import machine_info

    tokenizer_path = str(gguf_metadata_folder(resolve_model(None)))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    rng = random.Random(args.seed)
    needed = args.prefixes * len(POLICIES) * args.rounds
    if needed > len(TOPICS):
        raise SystemExit(f"{needed} prefixes asked for; at most {len(TOPICS)} topics")
    topics = rng.sample(TOPICS, needed)
    texts = [system_text(topic, args.prefix_tokens, tokenizer, rng) for topic in topics]

    # The KV cache: two of the longest prompts (template, question, answer) and the slack.
    def prompt_tokens(text: str) -> int:
        chat = [{"role": "system", "content": text}, {"role": "user", "content": "Q" * 60}]
        encoded = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
        return len(encoded["input_ids"])

    longest = max(prompt_tokens(text) for text in texts) + args.max_tokens
    num_blocks = 2 * math.ceil(longest / 16) + args.slack_blocks
    print(f"prompts of up to {longest} tokens; each replica's KV cache: {num_blocks} blocks")
    machine = machine_info()
    processes, arguments = start_replicas(num_blocks, args)
    phases = []
    try:
        ctx = {"urls": [url for _, url, _ in processes], "replicas": arguments}
        ctx["tokenizer_path"] = tokenizer_path
        for round_index in range(args.rounds):
            order = POLICIES if round_index % 2 == 0 else POLICIES[::-1]
            for policy in order:
                start = (round_index * len(POLICIES) + POLICIES.index(policy)) * args.prefixes
                ctx["round"] = round_index
                phase_texts = texts[start : start + args.prefixes]
                phases.append(run_phase(policy, phase_texts, args, ctx))
    finally:
        for process, _, _ in processes:
            peers.stop(process)
    by_policy = {p: [ph for ph in phases if ph["policy"] == p] for p in POLICIES}

    def over_rounds(values: list[float]) -> dict[str, Any]:
        return {"median": statistics.median(values), "rounds": values}

    medians = {
        p: {
            "prefix_hit_rate": over_rounds([ph["prefix_hit_rate"] for ph in runs]),
            "ttft_p50_s": over_rounds([ph["ttft_s"]["p50"] for ph in runs]),
            "ttft_mean_s": over_rounds([ph["ttft_s"]["mean"] for ph in runs]),
        }
        for p, runs in by_policy.items()
    }
    pairs = list(zip(by_policy["events"], by_policy["round-robin"], strict=True))
    ratios = [rr["ttft_s"]["p50"] / ev["ttft_s"]["p50"] for ev, rr in pairs]
    mean_ratios = [rr["ttft_s"]["mean"] / ev["ttft_s"]["mean"] for ev, rr in pairs]
    result = {
        "settings": vars(args),
        "model": "smollm2-135m-instruct (embedded Q4_1 GGUF), two replicas",
        "kv_cache_blocks_per_replica": num_blocks,
        "longest_prompt_tokens": longest,
        "machine": machine,
        "summary": {
            **medians,
            "ttft_p50_round_robin_over_events": over_rounds(ratios),
            "ttft_mean_round_robin_over_events": over_rounds(mean_ratios),
        },
        "phases": phases,
    }
    ev, rr = ({k: v["median"] for k, v in medians[p].items()} for p in POLICIES)
    print(
        f"medians over {args.rounds} rounds: prefix hits: events {ev['prefix_hit_rate']:.1%}, "
        f"round-robin {rr['prefix_hit_rate']:.1%}; TTFT p50: events "
        f"{ev['ttft_p50_s'] * 1e3:.0f} ms, round-robin {rr['ttft_p50_s'] * 1e3:.0f} ms "
        f"({statistics.median(ratios):.1f}x); mean TTFT {statistics.median(mean_ratios):.1f}x"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"prefix-routing-{device_slug(machine['cpu'])}.json"
    path.write_text(json.dumps(portable(result), indent=2) + "\n")
    print(f"results: {portable(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
