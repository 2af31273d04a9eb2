"""`hetero-infer serve` as a vLLM user writes it: the model as a positional argument,
--generation-config, --override-generation-config, --scheduling-policy and
--request-timeout (flags, HETERO_* variables and config.json keys alike)."""

from __future__ import annotations

import json

import pytest
from hetero_infer.server import cli

from tests.server.test_cli import settings_for


def test_the_model_as_a_positional_argument():
    assert settings_for(["/models/My-Model"], {}).engine.model == "/models/My-Model"
    settings = settings_for(["--port", "9000", "./m", "--max-num-seqs", "4"], {})
    assert settings.engine.model == "./m" and settings.port == 9000
    assert settings.model_name == "m"
    assert settings_for(["--model", "./m"], {}).engine.model == "./m"  # still works
    assert settings_for(["./m", "--model", "./m"], {}).engine.model == "./m"  # same twice
    # The argument is a flag: it goes over the environment.
    assert settings_for(["./m"], {"HETERO_MODEL": "./other"}).engine.model == "./m"


def test_two_different_models_are_an_error(capsys):
    with pytest.raises(ValueError, match="given twice"):
        settings_for(["./a", "--model", "./b"], {})
    assert cli.main(["serve", "./a", "--model", "./b"]) == 2
    assert "given twice, as './a' and as --model './b'" in capsys.readouterr().err


def test_scheduling_flags():
    argv = ["--scheduling-policy", "priority", "--request-timeout", "2.5"]
    engine = settings_for(argv, {}).engine
    assert engine.scheduling_policy == "priority" and engine.request_timeout == 2.5
    defaults = settings_for([], {}).engine
    assert defaults.scheduling_policy == "fcfs" and defaults.request_timeout is None
    env = {"HETERO_SCHEDULING_POLICY": "priority", "HETERO_REQUEST_TIMEOUT": "30"}
    assert settings_for([], env).engine.request_timeout == 30.0
    with pytest.raises(ValueError, match="scheduling_policy must be one of fcfs, priority"):
        settings_for(["--scheduling-policy", "sjf"], {})


def test_generation_config_flags():
    argv = ["--generation-config", "vllm", "--override-generation-config", '{"temperature": 0.5}']
    engine = settings_for(argv, {}).engine
    assert engine.generation_config == "vllm"
    assert engine.override_generation_config == {"temperature": 0.5}
    assert settings_for([], {}).engine.generation_config == "auto"
    env = {"HETERO_OVERRIDE_GENERATION_CONFIG": '{"top_k": 5}'}
    assert settings_for([], env).engine.override_generation_config == {"top_k": 5}


def test_mm_processor_kwargs_flag():
    argv = ["--mm-processor-kwargs", '{"max_pixels": 1003520}']
    assert settings_for(argv, {}).engine.mm_processor_kwargs == {"max_pixels": 1003520}
    assert settings_for([], {}).engine.mm_processor_kwargs is None
    env = {"HETERO_MM_PROCESSOR_KWARGS": '{"size": {"longest_edge": 1536}}'}
    assert settings_for([], env).engine.mm_processor_kwargs == {"size": {"longest_edge": 1536}}


@pytest.mark.parametrize("text", ["{temperature: 0.5}", "[0.5]", "0.5"])
def test_the_override_must_be_a_json_object(text, capsys):
    with pytest.raises(SystemExit):
        settings_for(["--override-generation-config", text], {})
    assert "--override-generation-config" in capsys.readouterr().err
    with pytest.raises(ValueError, match="HETERO_OVERRIDE_GENERATION_CONFIG"):
        settings_for([], {"HETERO_OVERRIDE_GENERATION_CONFIG": text})


def test_an_unknown_override_key_is_named():
    with pytest.raises(ValueError, match="unknown key 'temp'"):
        settings_for(["--override-generation-config", '{"temp": 0.5}'], {})


def test_config_file_keys(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "scheduling_policy": "priority",
                "request_timeout": 60,
                "generation_config": "vllm",
                "override_generation_config": {"max_new_tokens": 128},
            }
        )
    )
    engine = settings_for(["-c", str(config), "--request-timeout", "5"], {}).engine
    assert engine.scheduling_policy == "priority" and engine.request_timeout == 5.0
    assert engine.generation_config == "vllm"
    assert engine.override_generation_config == {"max_new_tokens": 128}


def test_one_shot_generation_takes_no_serving_flags():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--input", "hi", "--scheduling-policy", "priority"])
    with pytest.raises(SystemExit):
        cli.main(["tune", "--scheduling-policy", "priority"])
    # The seed's two limits are the engine's, so one-shot takes them.
    args = cli.build_parser().parse_args(["--input", "hi", "--max-batch-size", "2"])
    assert cli.engine_config_from_args(args, {}).max_num_seqs == 2
    with pytest.raises(SystemExit):  # the prompt is needed
        cli.build_parser().parse_args([])
