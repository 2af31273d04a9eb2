"""bench.vision: one round on the real engine and transformers, for each way an image
comes in (a file's bytes as the server takes them, or decoded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PIL import Image

from bench import vision


@pytest.mark.parametrize("kind", vision.INPUTS)
def test_one_round_hits_the_caches_on_the_second_question(kind: str, tmp_path: Path) -> None:
    out = tmp_path / "vision.json"
    args = ["--rounds", "1", "--threads", "1", "--width", "160", "--height", "120"]
    assert vision.main([*args, "--input", kind, "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["settings"]["input"] == kind
    first = result["results"]["first_question_ttft_s"]
    assert first["same_first_token_as_transformers"]
    (round_,) = result["results"]["rounds"]
    # The second question reuses the first's KV up to its new text: the image's blocks.
    second = round_["engine_second_question"]
    assert (
        second["prefix_cache_hit_tokens"] >= round_["engine_first_question"]["prompt_tokens"] // 2
    )


def test_each_seed_makes_another_image_of_the_kind_asked() -> None:
    as_file = vision.noise_image(7, 32, 24, "png")
    as_picture = vision.noise_image(7, 32, 24, "decoded")
    assert isinstance(as_file, bytes) and isinstance(as_picture, Image.Image)
    assert vision.decoded(as_file).size == as_picture.size == (32, 24)
    assert vision.noise_image(8, 32, 24, "png") != as_file
    assert vision.noise_image(7, 32, 24, "jpeg")[:2] == b"\xff\xd8"  # a JPEG's start
