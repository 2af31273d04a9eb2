"""Where `hetero-infer serve` takes its settings from: flags > HETERO_* env > config > defaults."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server import cli
from hetero_infer.server.cli import build_serve_parser, server_settings_from_args


def settings_for(argv: list[str], environ: dict[str, str]):
    return server_settings_from_args(build_serve_parser().parse_args(argv), environ)


def test_precedence(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"max_num_seqs": 8, "block_size": 32, "max_model_len": 100}))
    env = {"HETERO_MAX_NUM_SEQS": "16", "HETERO_PORT": "9001", "HETERO_API_KEY": "from-env"}
    settings = settings_for(["--config", str(config), "--max-num-seqs", "4"], env)
    assert settings.engine.max_num_seqs == 4  # flag over env over file
    assert settings.engine.block_size == 32  # file over default
    assert settings.port == 9001 and settings.api_key == "from-env"  # env over default
    settings = settings_for(["--config", str(config)], env)
    assert settings.engine.max_num_seqs == 16  # env over file
    defaults = settings_for([], {})
    assert defaults.port == 8000 and defaults.host == "127.0.0.1"
    assert defaults.engine.max_num_seqs == 256 and defaults.api_key is None


def test_origins_and_redaction():
    settings = settings_for(
        ["--allowed-origins", "http://a.test, http://b.test", "--api-key", "s3cret"], {}
    )
    assert settings.allowed_origins == ("http://a.test", "http://b.test")
    assert "s3cret" not in json.dumps(settings.redacted())


def test_enforce_eager_from_flag_and_environment():
    assert settings_for(["--enforce-eager"], {}).engine.enforce_eager
    assert settings_for([], {"HETERO_ENFORCE_EAGER": "true"}).engine.enforce_eager


def test_async_scheduling_from_flag_and_environment():
    assert settings_for([], {}).engine.async_scheduling is False  # as vLLM's
    assert settings_for(["--async-scheduling"], {}).engine.async_scheduling is True
    env = {"HETERO_ASYNC_SCHEDULING": "false"}
    assert settings_for([], env).engine.async_scheduling is False


def test_cpu_kernels_from_flag_and_environment():
    assert settings_for([], {}).engine.cpu_kernels
    assert not settings_for([], {"HETERO_CPU_KERNELS": "0"}).engine.cpu_kernels
    assert settings_for(["--cpu-kernels", "true"], {"HETERO_CPU_KERNELS": "0"}).engine.cpu_kernels
    assert not settings_for([], {}).engine.enforce_eager


def test_pooling_from_flag_and_environment():
    assert settings_for([], {}).engine.pooling == "last"  # vLLM's for decoder models
    assert settings_for(["--pooling", "mean"], {}).engine.pooling == "mean"
    assert settings_for([], {"HETERO_POOLING": "mean"}).engine.pooling == "mean"
    with pytest.raises(ValueError, match="pooling must be one of last, mean"):
        settings_for(["--pooling", "cls"], {})


def test_bad_environment_names_the_variable():
    with pytest.raises(ValueError, match="HETERO_MAX_NUM_SEQS"):
        settings_for([], {"HETERO_MAX_NUM_SEQS": "many"})


def test_served_model_names():
    default = settings_for(["--model", "/models/My-Model"], {})
    assert default.model_names == ("My-Model", "hetero-infer")
    assert default.model_name == "My-Model"
    assert settings_for([], {}).model_names == ("SmolLM2-135M-Instruct", "hetero-infer")
    several = settings_for(["--served-model-name", "first", "second"], {})
    assert several.model_names == ("first", "second") and several.model_name == "first"
    from_env = settings_for([], {"HETERO_SERVED_MODEL_NAME": "a, b"})
    assert from_env.model_names == ("a", "b")


def test_seed_flags_and_config_file(tmp_path):
    settings = settings_for(["--max-batch-size", "8", "--max-total-tokens", "512"], {})
    assert settings.engine.max_num_seqs == 8
    assert settings.engine.max_num_batched_tokens == 512
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "max_batch_size": 32,
                "max_num_seqs": 256,
                "serving": {"host": "0.0.0.0", "port": 3000, "model_name": "hetero-infer"},
            }
        )
    )
    settings = settings_for(["-c", str(config)], {})
    assert settings.engine.max_num_seqs == 32
    assert (settings.host, settings.port) == ("0.0.0.0", 3000)
    assert settings.model_names == ("hetero-infer",)
    assert settings_for(["-c", str(config), "--port", "9000"], {}).port == 9000  # flags win
    config.write_text(json.dumps({"serving": {"workers": 4}}))
    with pytest.raises(ValueError, match="serving takes host, port, model_name"):
        settings_for(["-c", str(config)], {})


def test_tool_calling_flags(tmp_path):
    template = tmp_path / "tools.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    argv = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template"]
    settings = settings_for([*argv, str(template), "--reasoning-parser", "qwen3"], {})
    assert settings.enable_auto_tool_choice and settings.tool_call_parser == "hermes"
    assert settings.reasoning_parser == "qwen3"
    assert settings.chat_template_text == template.read_text()
    assert "m.content" not in json.dumps(settings.redacted())  # the path, not the text
    env = {"HETERO_ENABLE_AUTO_TOOL_CHOICE": "true", "HETERO_TOOL_CALL_PARSER": "pythonic"}
    assert settings_for([], env).tool_call_parser == "pythonic"
    # The template's text itself is taken too, as vLLM does.
    assert settings_for(["--chat-template", "{{ x }}"], {}).chat_template_text == "{{ x }}"
    assert not settings_for([], {}).enable_auto_tool_choice


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tool-call-parser", "nope"], "tool_call_parser must be one of hermes"),
        (["--enable-auto-tool-choice"], "needs a tool_call_parser"),
        (["--reasoning-parser", "nope"], "reasoning_parser must be one of deepseek_r1, qwen3"),
        (["--chat-template", "/no/such/template.jinja"], "no such file"),
    ],
)
def test_bad_tool_calling_flags(argv, message):
    with pytest.raises(ValueError, match=message):
        settings_for(argv, {})


def test_tensor_parallel_size_from_flag_environment_and_torchrun():
    from hetero_infer.server.cli import under_torchrun

    assert settings_for(["--tensor-parallel-size", "2"], {}).engine.tensor_parallel_size == 2
    engine = settings_for([], {"HETERO_TENSOR_PARALLEL_SIZE": "4"}).engine
    assert engine.tensor_parallel_size == 4 and engine.distributed_executor_backend == "mp"
    # torchrun's variables make the engine join its ranks instead of starting its own.
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    config, rank = under_torchrun(engine.replace(tensor_parallel_size=2), torchrun)
    assert rank == 1 and config.distributed_executor_backend == "external_launcher"
    assert under_torchrun(engine, {}) == (engine, 0)  # not under torchrun
    with pytest.raises(ValueError, match="torchrun started 2 ranks: give --tensor-parallel-size 2"):
        under_torchrun(engine, torchrun)


def test_every_engine_setting_has_a_flag_and_a_variable():
    """The flags and HETERO_* variables are made from EngineConfig's fields: each has
    both, with its help text, in `serve` (and, but for the serving ones, in one-shot)."""
    serve_flags = {a.dest: a for a in cli.build_serve_parser()._actions}
    one_shot_flags = {a.dest: a for a in cli.build_parser()._actions}
    fields = dataclasses.fields(EngineConfig)
    assert {f.name for f in fields} <= set(serve_flags)
    for f in fields:
        assert serve_flags[f.name].help.startswith(f.metadata["help"]), f.name
        assert (f.name in one_shot_flags) != f.metadata["serving"], f.name
    values = {
        "gpu_memory_utilization": ("0.5", 0.5),
        "enable_prefix_caching": ("false", False),
        "preemption_mode": ("recompute", "recompute"),
        "distributed_executor_backend": ("external_launcher", "external_launcher"),
    }
    for name, (text, value) in values.items():  # had neither before they were generated
        flag = "--" + name.replace("_", "-")
        assert getattr(settings_for([flag, text], {}).engine, name) == value
        assert getattr(settings_for([], {f"HETERO_{name.upper()}": text}).engine, name) == value


def test_a_switch_takes_only_true_or_false():
    with pytest.raises(
        ValueError, match="HETERO_ENFORCE_EAGER: expected true or false, got 'maybe'"
    ):
        settings_for([], {"HETERO_ENFORCE_EAGER": "maybe"})
    with pytest.raises(SystemExit):
        settings_for(["--enforce-eager", "maybe"], {})
    assert settings_for(["--enforce-eager", "off"], {}).engine.enforce_eager is False


def test_the_lora_and_image_settings_from_the_environment():
    env = {
        "HETERO_ENABLE_LORA": "true",
        "HETERO_LORA_MODULES": "sql=/adapters/sql chat=/adapters/chat",
        "HETERO_MAX_IMAGE_BYTES": "1000",
        "HETERO_LIMIT_MM_PER_PROMPT": '{"image": 2}',
        "HETERO_ALLOWED_MEDIA_DOMAINS": "a.test,B.test",
    }
    settings = settings_for([], env)
    assert settings.lora_modules == (("sql", "/adapters/sql"), ("chat", "/adapters/chat"))
    assert settings.max_image_bytes == 1000 and settings.limit_mm_per_prompt["image"] == 2
    assert settings.allowed_media_domains == ("a.test", "b.test")
    flags = ["--allowed-media-domains", "c.test", "d.test", "--max-image-bytes", "2000"]
    settings = settings_for(flags, env)  # the flags win
    assert settings.allowed_media_domains == ("c.test", "d.test")
    assert settings.max_image_bytes == 2000


def test_a_settings_help_lists_its_choices():
    pooling = next(a for a in cli.build_serve_parser()._actions if a.dest == "pooling")
    assert pooling.help.endswith(" (last, mean)")
