"""server/ollama/model_facts.py: what /api/tags, /api/show and /api/ps say of the served
model. The parameter count is transformers' own count of the same config, for every
family (the experts of MoE layers, dense layers among them, shared experts, tied heads);
the files' size, time and digest follow the files; the quantization level names the
weights as served."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine.loader import resolve_model
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.ollama.model_facts import model_facts, parameter_count, parameter_size

from tests.tiny_models import TINY_MODELS, save_tiny_model

FAMILIES = [pytest.param(name, {}, id=name) for name in TINY_MODELS] + [
    pytest.param("olmoe", {"num_key_value_heads": 2}, id="olmoe-gqa")  # its norms span heads
]


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize(("family", "overrides"), FAMILIES)
def test_parameter_count_is_transformers_count(family: str, overrides: dict, tied: bool):
    config = TINY_MODELS[family]()
    for key, value in {**overrides, "tie_word_embeddings": tied}.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    expected = sum(param.numel() for param in model.parameters())
    assert parameter_count(ModelConfig.from_hf(config)) == expected


@pytest.mark.parametrize(
    ("count", "written"),
    [
        (999, "999"),
        (1000, "1K"),
        (999_499, "999K"),
        (1_000_000, "1M"),
        (134_515_008, "135M"),
        (8_030_261_248, "8.0B"),
        (1_540_000_000, "1.5B"),
    ],
)
def test_parameter_size_as_ollama_writes_it(count: int, written: str):
    assert parameter_size(count) == written


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, ModelConfig]:
    folder = save_tiny_model("llama", tmp_path_factory.mktemp("llama"))
    return folder, ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(folder))


def test_facts_of_a_folder_follow_its_files(tiny):
    folder, config = tiny
    engine = EngineConfig(model=str(folder))
    facts = model_facts(engine, config)
    weights = sorted(folder.glob("*.safetensors"))
    assert weights and facts.format == "safetensors" and facts.family == "llama"
    assert facts.size == sum(path.stat().st_size for path in weights)
    newest = max(path.stat().st_mtime_ns for path in weights)
    assert facts.modified_at == datetime.fromtimestamp(newest / 1e9, UTC).isoformat()
    assert facts.parameter_count == parameter_count(config)
    assert model_facts(engine, config).digest == facts.digest
    os.utime(weights[0], ns=(newest + 10**9, newest + 10**9))
    touched = model_facts(engine, config)
    assert touched.digest != facts.digest and touched.modified_at > facts.modified_at


@pytest.mark.parametrize(
    ("settings", "level"),
    [
        ({}, "F32"),  # the checkpoint's own dtype (the tiny models are saved in fp32)
        ({"dtype": "bfloat16"}, "BF16"),
        ({"dtype": "float16"}, "F16"),
        ({"quantization": "int8"}, "Q8_0"),
    ],
)
def test_quantization_level_names_the_served_weights(tiny, settings: dict, level: str):
    folder, config = tiny
    facts = model_facts(EngineConfig(model=str(folder), **settings), config)
    assert facts.quantization_level == level


def test_facts_of_the_packaged_gguf(tiny):
    _, config = tiny
    path = resolve_model(None).path
    facts = model_facts(EngineConfig(), config)
    assert facts.format == "gguf" and facts.quantization_level == "Q4_1"
    assert facts.size == path.stat().st_size


def test_a_hub_model_is_listed_without_its_files(tiny):
    _, config = tiny
    facts = model_facts(EngineConfig(model="nobody/not-on-this-machine"), config)
    assert facts.size == 0 and facts.format == "safetensors"
    assert facts.quantization_level == "unknown"
    assert facts.details()["parameter_size"] == parameter_size(parameter_count(config))
