"""bench/planes_instructions.py: the GEMVs compiled for sm90 here (triton's ptxas), in a
fresh Python without the interpreter, as tests/kernels/test_triton_compile.py does."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("triton.backends.nvidia.compiler")

from tests.kernels.test_triton_compile import run_compiling  # noqa: E402


def test_the_word_gemv_issues_half_the_byte_wise_instructions(tmp_path):
    out = tmp_path / "counts.json"
    run_compiling(
        "bench.planes_instructions",
        "--qtypes",
        "Q4_0",
        "--activation-rows",
        "1",
        "--json",
        str(out),
    )
    rows = json.loads(out.read_text())["rows"]
    per_value = {(r["kernel"], r["weight_rows"], r["unroll"]): r for r in rows}
    byte_wise = per_value["byte-wise", 2, 8]["lane_instructions_per_value"]
    words = per_value["words", 8, 1]["lane_instructions_per_value"]
    # Each loop was found, and holds the multiply-adds: at least 1 FFMA per value.
    assert all(r["loop_instructions"] > 0 and "FFMA" in r["top_opcodes"] for r in rows)
    assert words <= 0.55 * byte_wise, (words, byte_wise)
