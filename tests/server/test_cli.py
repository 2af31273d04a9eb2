"""Where `hetero-infer serve` takes its settings from: flags > HETERO_* env > config > defaults."""

from __future__ import annotations

import json

import pytest

from server.cli import build_serve_parser, server_settings_from_args


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
    assert not settings_for([], {}).engine.enforce_eager


def test_overlap_steps_from_flag_and_environment():
    assert settings_for(["--overlap-steps"], {}).engine.overlap_steps
    assert settings_for([], {"HETERO_OVERLAP_STEPS": "true"}).engine.overlap_steps
    assert not settings_for([], {}).engine.overlap_steps


def test_bad_environment_names_the_variable():
    with pytest.raises(ValueError, match="HETERO_MAX_NUM_SEQS"):
        settings_for([], {"HETERO_MAX_NUM_SEQS": "many"})
