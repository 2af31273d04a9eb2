"""The benchmark tables and figures of the documentation (README.md and docs/*.md),
rendered from the result files under bench/results/.

    python -m bench.report            # rewrite every page's generated tables and figures
    python -m bench.report --check    # exit 1 if one differs from its files (a test runs this)

A generated table sits in a page between two comments that name its kind and its
files (relative to bench/results/):

    <!-- bench.report: peers peers-smollm2-chat-q4_1-c16.json peers-...json -->
    ...
    <!-- /bench.report -->

A figure in prose sits between two comments too. The first names its file, the dotted
path (keys and list indices) to the number, optionally the path to the list of its
rounds' values (rendered after it as their low-high), and a template of the figure:
zeros for its digits, then its unit (a unit of % renders a fraction as a percentage).
It may wrap over lines, but not start one (Markdown would end the paragraph there):

    in int8, <!-- bench.figure: kv-cache-dtype-smollm2.json results.8191.speedup_int8.median
    results.8191.speedup_int8.rounds 0.00x -->1.32x (1.31-1.36)<!-- /bench.figure --> as fast

Everything between the comments is this module's output: edit the files or the
renderers, never the table or the figure.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __name__ == "__main__" and not __package__:
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.common import REPO_ROOT, RESULTS_DIR

# The pages that may hold generated tables and figures.
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"(<!-- bench\.report: (?P<kind>[\w-]+) (?P<files>[^>]*?) -->\n)"
    r"(?P<body>.*?)(<!-- /bench\.report -->)",
    re.DOTALL,
)
# The opening comment may wrap over lines (its paths are long); the figure itself,
# which this module writes, stays on the closing comment's line.
_FIGURE = re.compile(
    r"(?P<open><!-- bench\.figure:\s+(?P<file>\S+)\s+(?P<path>\S+)"
    r"(?:\s+(?P<spread>[A-Za-z_]\S*))?\s+(?P<template>0[^<>\n]*?)\s*-->)"
    r"(?P<figure>[^<\n]*)(?P<close><!-- /bench\.figure -->)"
)


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _range(values: list[float], digits: int = 2, suffix: str = "") -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    low, high = _num(min(values), digits), _num(max(values), digits)
    return f"{low}{suffix}" if low == high else f"{low}-{high}{suffix}"


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


def render_against_llama_server(results: list[dict[str, Any]]) -> str:
    """bench.single_stream and bench.peers files in one table, one row a file: ours
    against llama-server on one workload (one user's decode speed, or the output rate of
    concurrent users)."""
    rows = []
    for result in results:
        s = result["settings"]
        workload = "sampled chat" if s["workload"] == "chat" else s["workload"]
        if "systems" in result:  # bench.single_stream
            label = f"one user, {workload}, decode tok/s"
            ours = result["systems"]["ours"]["decode_tok_s"]["median"]
            theirs = result["systems"]["llama-server"]["decode_tok_s"]["median"]
            ratio = result["ratios"]["llama-server"]
            overall, by_round = ratio["overall"], list(ratio["by_round"].values())
        else:  # bench.peers
            users = s["concurrency"]
            label = f"{users} user{'s' if users > 1 else ''}, {workload}, output tok/s"
            ours = result["summary"]["ours"]["median_output_tok_s"]
            theirs = result["summary"]["llama-server"]["median_output_tok_s"]
            overall = result["summary"]["llama-server"]["ours_ratio_of_medians"]
            by_round = result["summary"]["llama-server"]["ours_ratio_by_round"]
        rows.append(
            [label, _num(ours), _num(theirs), f"**{overall:.2f}x**", _range(by_round, suffix="x")]
        )
    header = ["workload", "ours", "llama-server", "ours / llama-server", "by round"]
    return _table(header, rows)


def _median_and_range(values: list[float]) -> str:
    return f"{_num(statistics.median(values))} ({_range(values, digits=1)})"


def render_moe(results: list[dict[str, Any]]) -> str:
    """bench.moe: ours against llama-server on one MoE file, per number of users."""
    rows = []
    for result in results:
        for users, entry in result["summary"].items():
            if not isinstance(entry, dict):  # the bandwidth fractions beside them
                continue
            rows.append(
                [
                    f"{users} user{'s' if users != '1' else ''}, {entry['metric']}",
                    _median_and_range(entry["ours"]),
                    _median_and_range(entry["llama-server"]),
                    f"**{entry['ratio_median']:.2f}x**",
                    _range(entry["ratio_per_round"], suffix="x"),
                ]
            )
    header = ["users", "ours (rounds)", "llama-server (rounds)", "ours / llama-server", "by round"]
    return _table(header, rows)


def render_lora(results: list[dict[str, Any]]) -> str:
    """bench.lora: generated tokens/s with adapters over the base model's, one row a file."""
    rows = []
    for result in results:
        s, runs = result["settings"], result["results"]
        batch = runs["batch16_8_adapters"]["ratio_lora_over_base"]
        single = runs["single_stream"]["ratio_lora_over_base"]
        rows.append(
            [
                s["model"],
                s["dtype"],
                ", ".join(name.removesuffix("_proj") for name in s["modules"].split(",")),
                result["machine"]["cpu"].replace("(R)", ""),
                str(s["rounds"]),
                f"**{batch['median']:.2f}x**",
                _range(batch["rounds"], suffix="x"),
                f"**{single['median']:.2f}x**",
                _range(single["rounds"], suffix="x"),
            ]
        )
    header = [
        "model", "dtype", "adapters on", "CPU", "rounds", "batch of 16, 8 adapters",
        "by round", "one stream, 1 adapter", "by round",
    ]  # fmt: skip
    return _table(header, rows, right_from=4)


def render_openmp_spin(results: list[dict[str, Any]]) -> str:
    """bench.openmp_spin: output tok/s for each GOMP_SPINCOUNT, a column per file (an idle
    machine, or one beside busy processes)."""
    counts = sorted({int(count) for result in results for count in result["summary"]})
    header = ["`GOMP_SPINCOUNT`"]
    for result in results:
        busy = result["settings"]["busy"]
        where = f"beside {busy} busy process{'es' if busy > 1 else ''}" if busy else "idle machine"
        header.append(f"{where}, tok/s (rounds)")
    rows = []
    for count in counts:
        label = f"{count:,}"
        if count == 0:
            label += " (`OMP_WAIT_POLICY=PASSIVE`)"
        if count == results[0]["default_spin_count"]:
            label += " (the default)"
        row = [label]
        for result in results:
            entry = result["summary"].get(str(count))
            row.append(
                "-"
                if entry is None
                else f"{_num(entry['median_output_tok_s'], 0)} "
                f"({_range(entry['output_tok_s'], digits=0)})"
            )
        rows.append(row)
    return _table(header, rows)


def render_gpu_kernels(results: list[dict[str, Any]]) -> str:
    """bench.gpu_check's kernel step: for each kernel, the low-high over its cases (shapes
    and rows) of its time, bandwidth, share of the device's peak bandwidth and speed
    against the torch code."""
    rows = []
    for result in results:
        by_kernel: dict[str, list[dict[str, Any]]] = {}
        for case in result["steps"]["kernels"]["result"]["results"]:
            by_kernel.setdefault(case["kernel"], []).append(case)
        for kernel, cases in by_kernel.items():
            rows.append(
                [
                    kernel,
                    str(len(cases)),
                    _range([c["triton_us"] for c in cases], digits=0),
                    _range([c["gb_per_s"] for c in cases], digits=0),
                    _range([100 * c["fraction_of_peak"] for c in cases], digits=0, suffix="%"),
                    _range([c["speedup"] for c in cases], suffix="x"),
                ]
            )
    header = ["kernel", "cases", "us", "GB/s", "of peak", "x torch"]
    return _table(header, rows)


def render_planes_linear(results: list[dict[str, Any]]) -> str:
    """bench.gpu_check's planes steps: per type and rows, the low-high over Llama-8B's
    projections of the chosen tiles' time, share of the peak and speed against torch's
    bf16 matmul, and the sweep's fastest tiles' share of the peak where it got there."""
    rows = []
    for result in results:
        steps = result["steps"]
        cases = steps["planes linear"]["result"]["results"]
        swept = steps.get("planes sweep", {}).get("result", {}).get("sweep", [])
        for qtype, m in dict.fromkeys((c["qtype"], c["m"]) for c in cases):
            mine = [c for c in cases if (c["qtype"], c["m"]) == (qtype, m)]
            best = [c for c in swept if (c["qtype"], c["m"]) == (qtype, m)]
            rows.append(
                [
                    qtype,
                    str(m),
                    _range([c["planes_us"] for c in mine], digits=0),
                    _range([100 * c["fraction_of_peak"] for c in mine], digits=0, suffix="%"),
                    _range([c["x_torch"] for c in mine], suffix="x"),
                    _range([100 * c["best_fraction_of_peak"] for c in best], digits=0, suffix="%")
                    if best
                    else "-",
                ]
            )
    header = ["type", "rows", "us", "of peak", "x bf16", "swept best, of peak"]
    return _table(header, rows)


def render_step_time(results: list[dict[str, Any]]) -> str:
    """bench.step_time: a decode step's period, the runner's share, the device's busy
    and idle time and the host's own, per async setting and batch."""
    rows = []
    for result in results:
        for row in result["rows"]:
            rows.append(
                [
                    "on" if row["async_scheduling"] else "off",
                    str(row["batch"]),
                    *(
                        "-" if row.get(key) is None else f"{row[key]:.2f}"
                        for key in ("step_ms", "runner_ms", "busy_ms", "idle_ms", "host_ms")
                    ),
                ]
            )
    header = ["async", "batch", "step ms", "runner ms", "busy ms", "idle ms", "host ms"]
    return _table(header, rows)


RENDERERS: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "sampling": render_sampling,
    "peers": render_peers,
    "single-stream": render_single_stream,
    "serving-path": render_serving_path,
    "speculative": render_speculative,
    "against-llama-server": render_against_llama_server,
    "moe": render_moe,
    "lora": render_lora,
    "openmp-spin": render_openmp_spin,
    "gpu-kernels": render_gpu_kernels,
    "planes-linear": render_planes_linear,
    "step-time": render_step_time,
}


def _at(data: Any, path: str) -> Any:
    for key in path.split("."):
        data = data[int(key)] if isinstance(data, list) else data[key]
    return data


def render_figure(result: dict[str, Any], path: str, spread_path: str | None, template: str) -> str:
    """The number at ``path`` (dotted keys and list indices) in ``result``, with the
    digits and unit of ``template`` (``0.00x``: two digits, then "x"; a unit of % renders
    a fraction as a percentage), then the low-high of the values at ``spread_path`` in
    parentheses."""
    zeros, unit = re.fullmatch(r"0(?:\.(0+))?(.*)", template).groups()
    digits = len(zeros or "")
    scale = 100 if unit == "%" else 1
    figure = _num(_at(result, path) * scale, digits) + unit
    if spread_path:
        values = _at(result, spread_path)
        if isinstance(values, dict):  # rounds keyed by their number
            values = list(values.values())
        figure += f" ({_range([v * scale for v in values], digits)})"
    return figure


def render(text: str, results_dir: Path = RESULTS_DIR) -> str:
    """``text`` with every generated block and figure rendered anew from its files."""

    def block(match: re.Match) -> str:
        kind = match["kind"]
        if kind not in RENDERERS:
            raise ValueError(f"unknown table kind {kind!r} (from {', '.join(RENDERERS)})")
        files = [results_dir / name for name in match["files"].split()]
        results = [json.loads(path.read_text()) for path in files]
        return match[1] + RENDERERS[kind](results) + match[5]

    def figure(match: re.Match) -> str:
        result = json.loads((results_dir / match["file"]).read_text())
        try:
            rendered = render_figure(result, match["path"], match["spread"], match["template"])
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"{match['file']}: no number at {match[0]!r} ({error!r})") from None
        return match["open"] + rendered + match["close"]

    rendered, figures = _FIGURE.subn(figure, _BLOCK.sub(block, text))
    # A figure comment the pattern misses (a typo, a line break inside the figure)
    # would otherwise be left as typed, unchecked.
    openings = text.count("<!-- bench.figure:")
    if figures != openings:
        raise ValueError(f"{openings - figures} of {openings} bench.figure comments are malformed")
    # Markdown takes a comment that starts a line for a block of HTML and ends the
    # paragraph there, which would split the sentence around the figure.
    if re.search(r"^[ \t]*<!-- bench\.figure:", text, re.MULTILINE):
        raise ValueError("a bench.figure comment starts a line: put a word before it")
    return rendered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on a difference")
    parser.add_argument(
        "--page",
        type=Path,
        action="append",
        help="a markdown file to render, repeatable (default: README.md and docs/*.md)",
    )
    args = parser.parse_args(argv)
    pages = args.page or PAGES
    stale = []
    for page in pages:
        text = page.read_text()
        rendered = render(text)
        if rendered != text:
            stale.append(page)
            if not args.check:
                page.write_text(rendered)
    if args.check:
        for page in stale:
            print(f"{page}: a generated table or figure differs from its result files; "
                  "run python -m bench.report")  # fmt: skip
        return 1 if stale else 0
    print(f"rendered {len(pages)} pages, {len(stale)} of them changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
