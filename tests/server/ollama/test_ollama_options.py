"""Ollama's ``options`` (server/ollama/options.py) without an engine: each known
option is typed, mapped or accepted as inert; unknown keys and samplers we do not have
(at values that turn them on) are refused, naming them."""

from __future__ import annotations

import pytest
from hetero_infer.server.ollama.options import OllamaOptions
from pydantic import ValidationError


def test_sampling_options_map_to_the_openai_fields():
    options = OllamaOptions.model_validate(
        {
            "temperature": 0.3, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
            "stop": ["\n"], "repeat_penalty": 1.1, "presence_penalty": 0.5,
            "frequency_penalty": 0.2, "num_predict": 12, "repeat_last_n": -1,
        }
    )  # fmt: skip
    assert options.sampling_fields() == {
        "temperature": 0.3, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 7,
        "stop": ["\n"], "repetition_penalty": 1.1, "presence_penalty": 0.5,
        "frequency_penalty": 0.2,
    }  # fmt: skip
    assert options.max_tokens() == 12


def test_ollama_s_special_values():
    assert "seed" not in OllamaOptions(seed=-1).sampling_fields()  # a random draw
    assert OllamaOptions(num_predict=-1).max_tokens() is None
    assert OllamaOptions(num_predict=-2).max_tokens() is None
    assert OllamaOptions(num_predict=1).max_tokens() == 1
    assert OllamaOptions(seed=0).sampling_fields() == {"seed": 0}
    # repeat_last_n 0 turns the penalty off.
    assert OllamaOptions(repeat_penalty=1.3, repeat_last_n=0).sampling_fields() == {}


def test_inert_and_off_options_are_accepted():
    options = OllamaOptions.model_validate(
        {
            "num_ctx": 1_000_000, "num_thread": 8, "num_gpu": 99, "main_gpu": 0,
            "num_batch": 512, "use_mmap": True, "use_mlock": False, "numa": False,
            "num_keep": 4, "low_vram": False, "typical_p": 1.0, "tfs_z": 1.0,
            "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1,
            "penalize_newline": False, "repeat_last_n": 64,
        }
    )  # fmt: skip
    assert options.sampling_fields() == {}


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"foo": 1, "num_ctx": 2, "bar": 3}, "'bar', 'foo'"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"use_mmap": "yes"}, "use_mmap"),
        ({"mirostat": 2}, "mirostat"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"num_predict": 0}, "num_predict"),
        ({"num_predict": -3}, "num_predict"),
        ({"repeat_penalty": 1.2, "repeat_last_n": 64}, "repeat_last_n"),
        ({"repeat_penalty": 1.2, "penalize_newline": False}, "penalize_newline"),
    ],
)
def test_refused_options_are_named(options: dict, named: str):
    with pytest.raises(ValidationError) as refused:
        OllamaOptions.model_validate(options)
    assert named in str(refused.value)
