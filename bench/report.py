"""The benchmark tables of docs/benchmarks.md, rendered from the result files under
bench/results/.

    python -m bench.report            # rewrite the page's generated tables
    python -m bench.report --check    # exit 1 if one differs from its files (a test runs this)

A generated table sits in the page between two comments that name its kind and its
files (relative to bench/results/):

    <!-- bench.report: peers peers-smollm2-chat-q4_1-c16.json peers-...json -->
    ...
    <!-- /bench.report -->

Everything between them is this module's output: edit the files or the renderers,
never the table.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import REPO_ROOT, RESULTS_DIR

# The documentation page that holds the generated tables.
PAGE = REPO_ROOT / "docs" / "benchmarks.md"
_BLOCK = re.compile(
    r"(<!-- bench\.report: (?P<kind>[\w-]+) (?P<files>[^>]*?) -->\n)"
    r"(?P<body>.*?)(<!-- /bench\.report -->)",
    re.DOTALL,
)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _range(values: list[float], digits: int = 2, suffix: str = "") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    low, high = min(values), max(values)
    if f"{low:.{digits}f}" == f"{high:.{digits}f}":
        return f"{low:.{digits}f}{suffix}"
    return f"{low:.{digits}f}-{high:.{digits}f}{suffix}"


def _table(header: list[str], rows: list[list[str]], right_from: int = 1) -> str:
    align = ["---" if i < right_from else "---:" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ---- renderers: result files -> a markdown table ----


def render_sampling(results: list[dict[str, Any]]) -> str:
    """bench.sampling: each kind's engine rate and its ratio to greedy."""
    rows = []
    for result in results:
        for batch, kinds in result["batches"].items():
            for kind, record in kinds.items():
                rows.append(
                    [
                        batch,
                        kind,
                        _num(record["median_tok_s"]),
                        f"**{record['median_ratio']:.2f}x**",
                        _range(record["ratio_to_greedy"], suffix="x"),
                    ]
                )
    header = ["batch", "request kind", "tok/s (median)", "x greedy", "x greedy, by round"]
    return _table(header, rows, right_from=2)


def _llama_bench_tg(rounds: list[dict[str, Any]], output_len: int) -> str:
    from bench import llama_bench

    values = [llama_bench.tg(r["llama_bench"], output_len) for r in rounds if "llama_bench" in r]
    return _range([v for v in values if v is not None], digits=0)


def render_peers(results: list[dict[str, Any]]) -> str:
    """bench.peers with --rounds: ours against llama-server, one row per file."""
    rows = []
    for result in results:
        s, summary, rounds = result["settings"], result["summary"], result["rounds"]
        ours = summary.get("ours", {})
        theirs = summary.get("llama-server", {})
        ratio = theirs.get("ours_ratio_of_medians")
        rows.append(
            [
                f"{s['gguf_dtype'].upper()}",
                s["workload"],
                str(s["concurrency"]),
                _num(ours.get("median_output_tok_s")),
                _num(theirs.get("median_output_tok_s")),
                f"**{ratio:.2f}x**" if ratio else "-",
                _range(theirs.get("ours_ratio_by_round", []), suffix="x"),
                _llama_bench_tg(rounds, s["output_len"]),
                _range([r["load_average"] for r in rounds]),
            ]
        )
    header = [
        "file", "workload", "clients", "ours tok/s", "llama-server tok/s", "ours / llama-server",
        "by round", "llama-bench tg", "load avg",
    ]  # fmt: skip
    return _table(header, rows, right_from=2)


def render_single_stream(results: list[dict[str, Any]]) -> str:
    """bench.single_stream: one user's decode speed, ours against llama-server."""
    rows = []
    for result in results:
        s, systems = result["settings"], result["systems"]
        ratio = result["ratios"].get("llama-server", {})
        bench = result.get("llama_bench") or {}
        tg = list((bench.get("tg_by_round") or {}).values())
        rows.append(
            [
                s["gguf_dtype"].upper(),
                s.get("workload", "greedy"),
                _num(systems.get("ours", {}).get("decode_tok_s", {}).get("median")),
                _num(systems.get("llama-server", {}).get("decode_tok_s", {}).get("median")),
                f"**{ratio['overall']:.2f}x**" if ratio.get("overall") else "-",
                _range(list(ratio.get("by_round", {}).values()), suffix="x"),
                _range(tg, digits=0),
                _range(result.get("round_load") or []),
            ]
        )
    header = [
        "file", "workload", "ours decode tok/s", "llama-server", "ours / llama-server",
        "by round", "llama-bench tg", "load avg",
    ]  # fmt: skip
    return _table(header, rows, right_from=2)


def render_serving_path(results: list[dict[str, Any]]) -> str:
    """bench.serving_path: the server against the engine alone."""
    rows = []
    for result in results:
        workload = result["settings"]["workload"]
        for clients, record in result["clients"].items():
            rows.append(
                [
                    clients,
                    workload,
                    _num(record["median_engine_tok_s"]),
                    _num(record["median_server_tok_s"]),
                    f"**{record['server_to_engine']:.2f}x**",
                    _range(record["server_to_engine_by_round"], suffix="x"),
                ]
            )
    header = ["clients", "workload", "engine tok/s", "server tok/s", "server / engine", "by round"]
    return _table(header, rows, right_from=2)


def render_speculative(results: list[dict[str, Any]]) -> str:
    """bench.speculative: decode speed without speculation, with n-gram and with a
    draft model, per workload."""
    rows = []
    for result in results:
        for workload, entry in result["workloads"].items():
            row = [workload, _num(entry["off"]["median_decode_tok_s"])]
            for mode in ("ngram", "draft"):
                e = entry.get(mode)
                if e is None:
                    row.append("-")
                    continue
                rate = e["acceptance_rate"]
                accepted = f"; {rate:.0%} of {e['draft_tokens']} accepted" if rate else ""
                row.append(
                    f"{_num(e['median_decode_tok_s'])}, **{e['over_off']:.2f}x** "
                    f"({_range(e['over_off_per_round'], suffix='x')}{accepted})"
                )
            rows.append(row)
    header = ["workload", "no speculation, tok/s", "n-gram", "draft model"]
    return _table(header, rows, right_from=1)


RENDERERS: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "sampling": render_sampling,
    "peers": render_peers,
    "single-stream": render_single_stream,
    "serving-path": render_serving_path,
    "speculative": render_speculative,
}


def render(text: str, results_dir: Path = RESULTS_DIR) -> str:
    """``text`` with every generated block rendered anew from its files."""

    def block(match: re.Match) -> str:
        kind = match["kind"]
        if kind not in RENDERERS:
            raise ValueError(f"unknown table kind {kind!r} (from {', '.join(RENDERERS)})")
        files = [results_dir / name for name in match["files"].split()]
        results = [json.loads(path.read_text()) for path in files]
        return match[1] + RENDERERS[kind](results) + match[5]

    return _BLOCK.sub(block, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a difference")
    parser.add_argument("--page", type=Path, default=PAGE, help="the markdown file to render")
    args = parser.parse_args(argv)
    text = args.page.read_text()
    rendered = render(text)
    if args.check:
        if rendered != text:
            print(f"{args.page}: a generated table differs from its result files; "
                  "run python -m bench.report")  # fmt: skip
            return 1
        return 0
    args.page.write_text(rendered)
    print(f"rendered {len(_BLOCK.findall(text))} tables into {args.page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
