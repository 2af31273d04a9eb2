"""bench.vision_encoder: one round of each side, on the real towers."""

from __future__ import annotations

import json
from pathlib import Path

from bench import vision_encoder


def test_one_round_times_every_side_on_the_same_features(tmp_path: Path) -> None:
    out = tmp_path / "encoder.json"
    # 128-pixel tiles: 64 patches, which the connector's 4x4 shuffle takes.
    args = ["--rounds", "1", "--layers", "1", "--tiles", "1", "--image-size", "128"]
    args += ["--threads", "1"]
    assert vision_encoder.main([*args, "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    sides = {"engine_torch_linear", "engine_kernels", "engine_kernels_measured"}
    assert set(results["speedup_over_transformers"]) == sides
    assert set(results["seconds"]) == sides | {"transformers"}
    # The same features as transformers', up to bf16's rounding (the kernels' own, and
    # oneDNN's sums of the merged q/k/v in another order): a wrong part would be O(1).
    differences = results["max_difference_from_transformers_over_its_std"]
    assert set(differences) == sides
    assert all(difference < 0.2 for difference in differences.values())
