"""/api/tags, /api/show, /api/ps and /api/version: the served model as Ollama lists it.

Each served name is one model, listed with its tag (``:latest`` where it has none). The
model never unloads, so /api/ps lists it with an expiry far ahead, as Ollama lists a
model kept with ``keep_alive: -1``.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hetero_infer.engine.entrypoints.async_engine import AsyncEngine
from hetero_infer.server.ollama.model_facts import ModelFacts, model_facts
from hetero_infer.server.ollama.names import tagged
from hetero_infer.server.settings import ServerSettings

# The Ollama API version whose fields this server implements (clients gate features on it).
OLLAMA_API_VERSION = "0.12.0"
# Sampling defaults from the model's generation config, by their Ollama option names.
OPTION_NAMES = {
    "max_tokens": "num_predict",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "stop": "stop",
}


def facts(settings: ServerSettings, engine: AsyncEngine) -> ModelFacts:
    return model_facts(settings.engine, engine.model_config)


def tags(settings: ServerSettings, engine: AsyncEngine) -> dict[str, Any]:
    info = facts(settings, engine)
    entries = [
        {
            "name": tagged(name),
            "model": tagged(name),
            "modified_at": info.modified_at,
            "size": info.size,
            "digest": info.digest,
            "details": info.details(),
        }
        for name in settings.model_names
    ]
    return {"models": entries}


def running(settings: ServerSettings, engine: AsyncEngine) -> dict[str, Any]:
    info = facts(settings, engine)
    expires_at = (datetime.now(UTC) + timedelta(days=100 * 365)).isoformat()
    on_gpu = _on_gpu(settings.engine.device)
    entries = [
        {
            "name": tagged(name),
            "model": tagged(name),
            "size": info.size,
            "digest": info.digest,
            "details": info.details(),
            "expires_at": expires_at,
            "size_vram": info.size if on_gpu else 0,
            "context_length": engine.max_model_len,
        }
        for name in settings.model_names
    ]
    return {"models": entries}


def show(settings: ServerSettings, engine: AsyncEngine, template: str | None) -> dict[str, Any]:
    info = facts(settings, engine)
    capabilities = ["completion"]
    if settings.enable_auto_tool_choice:
        capabilities.append("tools")
    if settings.reasoning_parser:
        capabilities.append("thinking")
    if engine.model_config.vision is not None:  # clients offer image input on it
        capabilities.append("vision")
    parameters = _parameters(engine.generation_defaults.values)
    modelfile = f"# Served by Hetero-Paged-Infer\nFROM {settings.engine.model or info.family}\n"
    modelfile += "".join(f"PARAMETER {line}\n" for line in parameters)
    return {
        "license": "",
        "modelfile": modelfile,
        "parameters": "\n".join(parameters),
        "template": template or "",
        "details": info.details(),
        "model_info": _model_info(engine, info),
        "capabilities": capabilities,
        "modified_at": info.modified_at,
    }


def version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION}


def _on_gpu(device: str) -> bool:
    if device == "auto":
        import torch

        return torch.cuda.is_available()
    return device != "cpu"


def _parameters(defaults: dict[str, Any]) -> list[str]:
    """The model's default sampling values, one ``name value`` line each, as Ollama
    shows a Modelfile's PARAMETERs."""
    lines = []
    for field, value in sorted(defaults.items()):
        name = OPTION_NAMES.get(field)
        if name is None:
            continue
        for item in value if isinstance(value, list) else [value]:
            shown = f'"{item}"' if isinstance(item, str) else item
            lines.append(f"{name:<30} {shown}")
    return lines


def _model_info(engine: AsyncEngine, info: ModelFacts) -> dict[str, Any]:
    m = engine.model_config
    arch = m.model_type
    experts = {}
    if m.moe is not None:  # as a GGUF file of an MoE model names them
        experts = {
            f"{arch}.expert_count": m.moe.num_experts,
            f"{arch}.expert_used_count": m.moe.top_k,
            f"{arch}.expert_feed_forward_length": m.moe.expert_intermediate_size,
        }
    return {
        "general.architecture": arch,
        "general.parameter_count": info.parameter_count,
        f"{arch}.context_length": engine.max_model_len,
        f"{arch}.embedding_length": m.hidden_size,
        f"{arch}.feed_forward_length": m.intermediate_size,
        f"{arch}.block_count": m.num_layers,
        f"{arch}.attention.head_count": m.num_heads,
        f"{arch}.attention.head_count_kv": m.num_kv_heads,
        f"{arch}.attention.key_length": m.head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": m.rms_norm_eps,
        f"{arch}.rope.freq_base": m.rope_theta,
        f"{arch}.vocab_size": m.vocab_size,
        **experts,
    }
