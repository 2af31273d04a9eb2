"""bench/linear_choice.py on a small layer: a file with each shape's ratios per row
count, their rounds, and the choice their medians make."""

from __future__ import annotations

import json

import pytest
from hetero_infer.kernels.linear_choice import KERNEL, ONEDNN, TIMED_ROWS

from bench import linear_choice

pytestmark = pytest.mark.cpu_kernels("linear_packed")


def test_writes_each_shapes_ratios_and_choice(tmp_path):
    out = tmp_path / "choice.json"
    argv = ["--hidden", "64", "--intermediate", "96", "--heads", "2", "--kv-heads", "1"]
    record = linear_choice.main([*argv, "--rounds", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    assert set(record["results"]) == {"qkv", "o", "gate_up", "down"}
    gate_up = record["results"]["gate_up"]
    assert tuple(gate_up["shape"]) == (192, 64, True)
    ratios = gate_up["ours_over_onednn_time"]
    assert list(ratios) == [str(rows) for rows in TIMED_ROWS]
    assert all(len(cell["rounds"]) == 2 and cell["median"] > 0 for cell in ratios.values())
    assert len(gate_up["choice"]) == len(TIMED_ROWS) and set(gate_up["choice"]) <= {KERNEL, ONEDNN}
    assert record["machine"]["cpu"] and "command" in record
