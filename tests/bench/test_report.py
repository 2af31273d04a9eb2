"""bench.report: the tables of docs/benchmarks.md are its renderers' output of the
committed result files (no figure is copied by hand), and the renderers on made-up
results."""

from __future__ import annotations

import json
from pathlib import Path

from bench import peers, report


def test_the_benchmark_page_tables_are_rendered_from_the_committed_results() -> None:
    text = report.PAGE.read_text()
    blocks = report._BLOCK.findall(text)
    assert blocks, f"{report.PAGE} has no generated tables"
    assert report.render(text) == text, "run: python -m bench.report"


def _peers_result(ours: list[float], theirs: list[float]) -> dict:
    rounds = [
        {
            "round": i + 1,
            "load_average": 1.0 + i,
            "results": {"ours": {"output_throughput": o}, "llama-server": {"output_throughput": t}},
            "llama_bench": {"tests": {"tg96": {"tok_s": 200.0 + i, "std": 1.0}}},
        }
        for i, (o, t) in enumerate(zip(ours, theirs, strict=True))
    ]
    settings = {"gguf_dtype": "q4_0", "workload": "chat", "concurrency": 16, "output_len": 96}
    return {"settings": settings, "rounds": rounds, "summary": peers.rounds_summary(rounds)}


def test_rounds_summary_takes_ratios_by_round_and_of_medians() -> None:
    summary = _peers_result([300.0, 200.0, 330.0], [100.0, 100.0, 110.0])["summary"]
    assert summary["ours"]["median_output_tok_s"] == 300.0
    assert summary["llama-server"]["ours_ratio_by_round"] == [3.0, 2.0, 3.0]
    assert summary["llama-server"]["ours_ratio_of_medians"] == 3.0


def test_a_block_is_replaced_by_its_renderers_output(tmp_path: Path) -> None:
    (tmp_path / "p.json").write_text(json.dumps(_peers_result([300.0, 200.0], [100.0, 100.0])))
    text = "before\n<!-- bench.report: peers p.json -->\nstale\n<!-- /bench.report -->\nafter\n"
    out = report.render(text, tmp_path)
    assert "stale" not in out and out.startswith("before\n") and out.endswith("after\n")
    row = out.splitlines()[4]
    assert row.startswith("| Q4_0 | chat | 16 | 250.0 | 100.0 | **2.50x** | 2.00-3.00x | 200-201 |")
    assert report.render(out, tmp_path) == out


def test_main_checks_then_rewrites_the_page_it_is_given(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    stale = "<!-- bench.report: sampling sampling-smollm2.json -->\nstale\n<!-- /bench.report -->\n"
    page.write_text(stale)
    assert report.main(["--check", "--page", str(page)]) == 1
    assert page.read_text() == stale, "--check must not write"
    assert report.main(["--page", str(page)]) == 0
    assert "stale" not in page.read_text()
    assert report.main(["--check", "--page", str(page)]) == 0
