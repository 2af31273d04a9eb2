"""ServerSettings' checks at their edges: the ranges vLLM's flags take, LoRA module
names, and a chat template given as text or as a file."""

from __future__ import annotations

import pytest
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.settings import ServerSettings, parse_lora_modules, read_chat_template


@pytest.mark.parametrize("port", [1, 65535])
def test_the_ports_ends_are_taken(port):
    assert ServerSettings(port=port).port == port


@pytest.mark.parametrize("port", [0, 65536])
def test_a_port_past_them_is_refused(port):
    with pytest.raises(ValueError, match="port must be in 1..65535"):
        ServerSettings(port=port)


@pytest.mark.parametrize("name", ["max_waiting_requests", "max_body_bytes", "max_image_bytes"])
def test_limits_take_one_and_refuse_zero(name):
    assert getattr(ServerSettings(**{name: 1}), name) == 1
    with pytest.raises(ValueError, match=f"{name} must be at least 1"):
        ServerSettings(**{name: 0})


def test_a_zero_shutdown_timeout_is_taken_and_a_negative_one_refused():
    assert ServerSettings(shutdown_timeout=0).shutdown_timeout == 0
    with pytest.raises(ValueError, match="shutdown_timeout"):
        ServerSettings(shutdown_timeout=-0.5)


def with_lora(modules: list[str]) -> ServerSettings:
    return ServerSettings(engine=EngineConfig(enable_lora=True), lora_modules=modules)


def test_lora_names_are_unique_among_themselves_and_the_models():
    assert with_lora(["a=/x", "b=/y"]).lora_modules == (("a", "/x"), ("b", "/y"))
    with pytest.raises(ValueError, match="'a' is given twice"):
        with_lora(["a=/x", "a=/y"])
    with pytest.raises(ValueError, match="'hetero-infer' is given twice"):
        with_lora(["hetero-infer=/x"])


def test_lora_modules_after_a_json_one_are_read_too():
    items = ['{"name": "a", "path": "/x", "base_model_name": "m"}', "b=/y", "c=/z"]
    assert parse_lora_modules(items) == (("a", "/x"), ("b", "/y"), ("c", "/z"))


@pytest.mark.parametrize("item", ["a", "=/x", "a=", "="])
def test_a_module_without_name_or_path_is_refused(item):
    with pytest.raises(ValueError, match="is not name=path"):
        parse_lora_modules([item])


def test_a_template_too_long_for_a_path_is_its_own_text():
    text = "{{ messages[0]['content'] }}" + " " * 5000
    assert read_chat_template(text) == text
    with pytest.raises(ValueError, match="cannot read"):
        read_chat_template("x" * 5000)


def test_the_templates_text_is_read_not_given_and_left_out_of_repr(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{{ 'SECRET-TEMPLATE' }}")
    settings = ServerSettings(chat_template=str(template))
    assert settings.chat_template_text == "{{ 'SECRET-TEMPLATE' }}"
    assert "SECRET-TEMPLATE" not in repr(settings)
    with pytest.raises(TypeError):
        ServerSettings(chat_template_text="{{ 'x' }}")
