"""bench.amx: one round of its prefill workload on the real engine, with AMX's tiles on
and off (skipped where the CPU has none)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import amx


@pytest.mark.cpu_kernels("amx_tiles")
def test_one_round_compares_the_tiles_with_the_avx512_code(tmp_path: Path) -> None:
    out = tmp_path / "amx.json"
    amx.main(["--rounds", "1", "--workloads", "prefill", "--out", str(out)])
    record = json.loads(out.read_text())
    assert "amx_tile" in record["machine"]["cpu_flags"]
    prefill = record["results"]["prefill"]
    runs = prefill["runs"]
    assert len(runs["on"]) == len(runs["off"]) == 1
    assert prefill["ratio_on_over_off"]["rounds"] == [
        runs["on"][0]["total_tokens_per_s"] / runs["off"][0]["total_tokens_per_s"]
    ]
    # The switch is left on, as the engine's default.
    from hetero_infer.kernels.cpu_extension import load_cpu_kernels

    assert load_cpu_kernels().set_amx_tiles(True) is True


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(SystemExit):
        amx.main(["--workloads", "nope"])
