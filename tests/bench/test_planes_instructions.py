"""bench/planes_instructions.py: the GEMVs compiled for sm90 here (triton's ptxas), in a
fresh Python without the interpreter, as tests/kernels/test_triton_compile.py does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia.compiler")


def test_the_word_gemv_issues_half_the_byte_wise_instructions(tmp_path):
    out = tmp_path / "counts.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    command = ["-m", "bench.planes_instructions", "--qtypes", "Q4_0", "--activation-rows", "1"]
    result = subprocess.run(
        [sys.executable, *command, "--json", str(out)],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    per_value = {(r["kernel"], r["weight_rows"], r["unroll"]): r for r in rows}
    byte_wise = per_value["byte-wise", 2, 8]["lane_instructions_per_value"]
    words = per_value["words", 8, 1]["lane_instructions_per_value"]
    # Each loop was found, and holds the multiply-adds: at least 1 FFMA per value.
    assert all(r["loop_instructions"] > 0 and "FFMA" in r["top_opcodes"] for r in rows)
    assert words <= 0.55 * byte_wise, (words, byte_wise)
