"""EngineConfig: flat construction, aliases, validation naming the field, from_file."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hetero_infer.engine import EngineConfig

REPO = Path(__file__).resolve().parents[3]


def test_defaults_and_seed_alias():
    config = EngineConfig(block_size=32, max_num_seqs=8, max_total_tokens=100)
    assert config.max_num_batched_tokens == 100
    assert config.block_size == 32 and config.enable_prefix_caching
    with pytest.raises(AttributeError):
        config.block_size = 16  # frozen


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("block_size", 0),
        ("max_num_seqs", -1),
        ("max_num_batched_tokens", 1.5),
        ("max_num_blocks", 0),
        ("max_model_len", 0),
        ("num_cpu_blocks", -3),
        ("memory_threshold", 0),
        ("memory_threshold", 1.5),
        ("gpu_memory_utilization", True),
        ("dtype", "float64"),
        ("quantization", "awq"),
        ("device", "tpu"),
        ("enable_prefix_caching", "yes"),
        ("enforce_eager", 1),
        ("async_scheduling", "on"),
        ("attention_backend", "cuda"),
        ("model", ""),
        ("seed", -1),
        ("preemption_mode", "swap"),  # without CPU blocks
    ],
)
def test_bad_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=field if field != "preemption_mode" else "num_cpu_blocks"):
        EngineConfig(**{field: value})


def test_async_scheduling_refuses_speculation():
    speculative = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="async_scheduling.*speculative_config"):
        EngineConfig(async_scheduling=True, speculative_config=speculative)
    EngineConfig(async_scheduling=None, speculative_config=speculative)  # off by default


def test_repo_config_json_holds_every_setting_at_its_default():
    path = REPO / "config.json"
    names = [field.name for field in dataclasses.fields(EngineConfig)]
    assert list(json.loads(path.read_text())) == names
    assert EngineConfig.from_file(path) == EngineConfig()


def test_from_file_names_file_and_key(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"block_size": 16, "blok_size": 3}))
    with pytest.raises(ValueError, match=r"c\.json.*'blok_size'"):
        EngineConfig.from_file(path)
    path.write_text(json.dumps({"max_num_seqs": "many"}))
    with pytest.raises(ValueError, match=r"c\.json.*max_num_seqs"):
        EngineConfig.from_file(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"c\.json.*invalid JSON"):
        EngineConfig.from_file(path)
    with pytest.raises(ValueError, match="missing.json"):
        EngineConfig.from_file(tmp_path / "missing.json")


def test_from_file_overrides_and_alias(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"max_total_tokens": 64, "block_size": 8, "_comment": "x"}))
    config = EngineConfig.from_file(path, block_size=32, max_num_seqs=None)
    assert config.max_num_batched_tokens == 64 and config.block_size == 32
    assert config.max_num_seqs == 256
