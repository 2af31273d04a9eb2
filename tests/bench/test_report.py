"""bench.report: the tables and figures of README.md and docs/*.md are its renderers'
output of the committed result files (no figure is copied by hand), and the renderers
on made-up results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import peers, report


def test_every_page_is_rendered_from_the_committed_results() -> None:
    tables = figures = 0
    for page in report.PAGES:
        text = page.read_text()
        tables += len(report._BLOCK.findall(text))
        figures += len(report._FIGURE.findall(text))
        assert report.render(text) == text, f"{page}: run python -m bench.report"
    # Counted so that the test cannot pass on pages that lost their comments.
    benchmarks = report.REPO_ROOT / "docs" / "benchmarks.md"
    assert report._BLOCK.findall(benchmarks.read_text()), f"{benchmarks} has no generated tables"
    assert tables > 0 and figures > 0, f"{tables} generated tables, {figures} figures"


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


def test_a_figure_is_the_number_at_its_path_then_the_range_of_its_rounds(tmp_path: Path) -> None:
    result = {"runs": [{"ratio": 4.126, "rounds": [3.342, 5.123, 4.0]}], "share": 0.8355}
    (tmp_path / "r.json").write_text(json.dumps(result))
    figure = (
        "<!-- bench.figure: r.json runs.0.ratio runs.0.rounds 0.00x -->3.83x<!-- /bench.figure -->"
    )
    text = (
        f"ran {figure} as fast, at <!-- bench.figure: r.json\nshare 0% -->1%<!-- /bench.figure -->."
    )
    out = report.render(text, tmp_path)
    assert ">4.13x (3.34-5.12)<" in out and ">84%<" in out and "3.83x" not in out
    assert report.render(out, tmp_path) == out
    assert report.render_figure({"n": 4022.3}, "n", None, "0 GB/s") == "4,022 GB/s"


def test_a_figure_comment_that_is_malformed_or_starts_a_line_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({"ratio": 2.0}))
    with pytest.raises(ValueError, match="malformed"):
        report.render("a <!-- bench.figure: r.json ratio -->2x<!-- /bench.figure -->", tmp_path)
    with pytest.raises(ValueError, match="starts a line"):
        report.render("a\n<!-- bench.figure: r.json ratio 0x -->2x<!-- /bench.figure -->", tmp_path)
    with pytest.raises(ValueError, match="no number"):
        report.render("a <!-- bench.figure: r.json speed 0x -->2x<!-- /bench.figure -->", tmp_path)
