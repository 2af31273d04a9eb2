"""Default sampling values from generation_config.json (--generation-config auto, vllm
or a folder, and --override-generation-config), read once when the engine loads."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from hetero_infer.engine import EngineConfig, LLMEngine
from hetero_infer.engine.loader.packaged import packaged_sampling
from hetero_infer.engine.loader.source import ModelSource
from hetero_infer.engine.params.generation_defaults import load_generation_defaults
from hetero_infer.engine.settings.exceptions import ConfigError

from tests.tiny_models import save_tiny_model

# As a model's makers write it: sampling keys, and keys that are not read.
QWEN_STYLE = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "max_new_tokens": 64,
    "min_p": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
EXPECTED = {
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "max_tokens": 64,
}


def write_generation_config(folder, values: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "generation_config.json").write_text(json.dumps(values))


def test_auto_reads_the_models_file(tmp_path):
    write_generation_config(tmp_path, QWEN_STYLE)
    defaults = load_generation_defaults("auto", None, tmp_path)
    assert defaults.values == EXPECTED
    assert defaults.max_tokens == 64 and "max_tokens" not in defaults.sampling
    assert str(tmp_path / "generation_config.json") in defaults.describe()


def test_auto_without_a_file_has_no_defaults(tmp_path):
    defaults = load_generation_defaults("auto", None, tmp_path)
    assert defaults.values == {} and defaults.max_tokens is None
    assert "no generation_config.json in" in defaults.describe()


def test_a_gguf_file_takes_the_generation_config_beside_it(tmp_path):
    # A GGUF file holds no generation config: "auto" looks in the file's folder.
    source = ModelSource(path=tmp_path / "model.Q4_0.gguf", gguf_file="model.Q4_0.gguf")
    write_generation_config(tmp_path, {"temperature": 0.3})
    assert load_generation_defaults("auto", None, source.folder).values == {"temperature": 0.3}


def test_vllm_ignores_the_file_but_not_the_override(tmp_path):
    write_generation_config(tmp_path, QWEN_STYLE)
    assert load_generation_defaults("vllm", None, tmp_path).values == {}
    defaults = load_generation_defaults("vllm", {"temperature": 0.5}, tmp_path)
    assert defaults.values == {"temperature": 0.5}
    assert "--override-generation-config" in defaults.describe()


def test_the_override_goes_over_the_file(tmp_path):
    write_generation_config(tmp_path, QWEN_STYLE)
    defaults = load_generation_defaults("auto", {"temperature": 0.5, "max_new_tokens": 8}, tmp_path)
    assert defaults.values == {**EXPECTED, "temperature": 0.5, "max_tokens": 8}


def test_a_folder_of_its_own(tmp_path):
    write_generation_config(tmp_path / "elsewhere", {"top_k": 5})
    write_generation_config(tmp_path / "model", QWEN_STYLE)
    defaults = load_generation_defaults(str(tmp_path / "elsewhere"), None, tmp_path / "model")
    assert defaults.values == {"top_k": 5}
    with pytest.raises(ConfigError, match="has no generation_config.json"):
        load_generation_defaults(str(tmp_path / "nowhere"), None, tmp_path / "model")


def test_bad_values_fail_at_load_naming_the_file(tmp_path):
    write_generation_config(tmp_path, {"temperature": -1})
    with pytest.raises(ConfigError, match="generation_config.json: temperature"):
        load_generation_defaults("auto", None, tmp_path)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot read"):
        load_generation_defaults("auto", None, tmp_path)


@pytest.mark.parametrize(
    "override, message",
    [
        ({"temprature": 0.5}, "unknown key 'temprature'"),
        ({"max_tokens": 5}, "unknown key 'max_tokens'"),  # the file's name: max_new_tokens
        ({"top_p": 2}, "top_p"),
        ([0.5], "JSON object"),
    ],
)
def test_engine_config_checks_the_override(override, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(override_generation_config=override)


def test_config_file_keys(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({"generation_config": "vllm", "override_generation_config": {"top_k": 3}})
    )
    config = EngineConfig.from_file(path)
    assert config.generation_config == "vllm"
    assert config.override_generation_config == {"top_k": 3}


def test_the_engine_loads_them_and_says_so(tmp_path, caplog):
    folder = save_tiny_model("llama", tmp_path / "llama")
    write_generation_config(folder, QWEN_STYLE)
    with caplog.at_level(logging.INFO, logger="hetero_infer.engine.entrypoints.llm_engine"):
        engine = LLMEngine(EngineConfig(model=str(folder), max_model_len=128, max_num_blocks=16))
    assert engine.generation_defaults.values == EXPECTED
    logged = [r.getMessage() for r in caplog.records if "default sampling values" in r.getMessage()]
    assert logged and "temperature=0.7" in logged[0] and str(folder) in logged[0]
    params = engine.default_sampling_params(temperature=0.0)
    assert params.temperature == 0.0 and params.top_k == 20 and params.max_tokens == 64
    # "vllm" keeps the built-in defaults, and says that too.
    copy = shutil.copytree(folder, tmp_path / "copy")
    config = EngineConfig(model=str(copy), max_model_len=128, max_num_blocks=16)
    engine = LLMEngine(config.replace(generation_config="vllm"))
    assert engine.generation_defaults.values == {}
    assert engine.default_sampling_params().temperature == 1.0


def test_a_packaged_models_own_values_where_no_file_says(tmp_path):
    packaged = {"temperature": 0.2, "top_p": 0.9}
    defaults = load_generation_defaults("auto", None, tmp_path, packaged)
    assert defaults.values == packaged and "the packaged model's card" in defaults.describe()
    write_generation_config(tmp_path, {"temperature": 0.3})  # a file beside it wins
    assert load_generation_defaults("auto", None, tmp_path, packaged).values == {"temperature": 0.3}
    assert load_generation_defaults("vllm", None, tmp_path, packaged).values == {}
    override = load_generation_defaults("auto", {"top_p": 0.5}, tmp_path / "none", packaged)
    assert override.values == {"temperature": 0.2, "top_p": 0.5}


def test_the_embedded_model_samples_as_its_card_says():
    assert packaged_sampling(None) == {"temperature": 0.2, "top_p": 0.9}
    assert packaged_sampling("smollm2-135m-instruct") == packaged_sampling(None)
    assert packaged_sampling("./some-folder") == {}
