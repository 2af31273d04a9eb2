"""A Phi-3 GGUF file's RoPE settings read into the converted config: the rotated dims
(Phi-4-mini's partial RoPE) and the LongRoPE factors that llama.cpp's converter stores
as tensors, which transformers' conversion of the metadata leaves out."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import transformers
from hetero_infer.engine.loader.gguf_header import read_gguf_header
from hetero_infer.engine.loader.gguf_rope import phi3_rope_from_gguf
from hetero_infer.engine.models.config import ModelConfig

from tests.tiny_models import TINY_MODELS


def write_phi3_rope(path: Path, config: transformers.Phi3Config, rotary_dim: int) -> Path:
    """The RoPE part of a Phi-3 GGUF file as llama.cpp's converter writes it."""
    rope = config.rope_parameters
    writer = gguf.GGUFWriter(path, "phi3")
    writer.add_rope_dimension_count(rotary_dim)
    writer.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
    writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
    writer.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def converted(config: transformers.Phi3Config) -> transformers.Phi3Config:
    """The config as transformers converts a Phi-3 GGUF's metadata: plain RoPE on whole
    heads, and the original context length at Phi3Config's default."""
    plain = transformers.Phi3Config(**config.to_dict())
    plain.rope_parameters = {
        "rope_type": "default",
        "rope_theta": config.rope_parameters["rope_theta"],
    }
    plain.original_max_position_embeddings = 4096
    return plain


def test_phi3_rope_settings_come_from_the_file(tmp_path: Path) -> None:
    original = TINY_MODELS["phi3"]()  # RoPE on 18 of 24 dims, LongRoPE
    config = converted(original)
    assert ModelConfig.from_hf(config).rotary_dim is None
    path = write_phi3_rope(tmp_path / "phi3.gguf", original, rotary_dim=18)
    phi3_rope_from_gguf(read_gguf_header(path), config)
    ours, expected = ModelConfig.from_hf(config), ModelConfig.from_hf(original)
    assert ours.rotary_dim == expected.rotary_dim == 18
    assert ours.rope_scaling["rope_type"] == "longrope"
    for key, value in expected.rope_scaling.items():
        if key.endswith("_factor") and isinstance(value, list):  # stored as float32
            assert np.array_equal(np.float32(ours.rope_scaling[key]), np.float32(value)), key
        else:
            assert ours.rope_scaling[key] == value, key


def test_a_plain_phi3_file_keeps_plain_rope(tmp_path: Path) -> None:
    """Phi-3-mini-4k: whole heads rotated, no factor tensors: nothing changes."""
    original = TINY_MODELS["phi3"]()
    config = converted(original)
    writer = gguf.GGUFWriter(tmp_path / "plain.gguf", "phi3")
    writer.add_rope_dimension_count(24)
    writer.add_tensor("token_embd.weight", np.zeros((2, 4), np.float32))
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file):
        step()
    writer.write_tensors_to_file()
    writer.close()
    phi3_rope_from_gguf(read_gguf_header(tmp_path / "plain.gguf"), config)
    ours = ModelConfig.from_hf(config)
    assert ours.rotary_dim is None and ours.rope_scaling is None
