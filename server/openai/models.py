"""/v1/models: the names the server answers to, each a card for the one model, in the
shape vLLM gives (OpenAI's fields, then root, parent, max_model_len and permission)."""

from __future__ import annotations

from typing import Any

from hetero_infer.server.openai.responses import new_id, now
from hetero_infer.server.settings import ServerSettings

OWNER = "hetero-paged-infer"


def model_list(settings: ServerSettings, max_model_len: int | None) -> dict[str, Any]:
    """``max_model_len`` is None while the model loads."""
    return {
        "object": "list",
        "data": [model_card(name, settings, max_model_len) for name in settings.model_names],
    }


def model_card(name: str, settings: ServerSettings, max_model_len: int | None) -> dict[str, Any]:
    created = now()
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNER,
        # The model path (or hub id, or .gguf file) every served name stands for.
        "root": settings.engine.model or settings.model_name,
        "parent": None,  # vLLM names a LoRA adapter's base model here; there are none
        "max_model_len": max_model_len,
        "permission": [_permission(created)],
    }


def _permission(created: int) -> dict[str, Any]:
    """What the served model allows, as vLLM reports it: sampling, logprobs and viewing,
    from any organization; no fine-tuning, search indices or engine creation."""
    return {
        "id": new_id("modelperm"),
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
