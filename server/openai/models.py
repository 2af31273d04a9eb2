"""/v1/models: the names the server answers to, each a card for the one model, in the
shape vLLM gives (OpenAI's fields, then root, parent, max_model_len and permission)."""

from __future__ import annotations

from typing import Any

from hetero_infer.server.serving.answer_parts import new_id, now
from hetero_infer.server.settings import ServerSettings

OWNER = "hetero-paged-infer"


def model_list(
    settings: ServerSettings,
    max_model_len: int | None,
    adapters: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """``max_model_len`` is None while the model loads; ``adapters``: the loaded LoRA
    adapters' (name, folder), listed after the model's names with it as their parent."""
    cards = [model_card(name, settings, max_model_len) for name in settings.model_names]
    for name, path in adapters or []:
        cards.append(model_card(name, settings, max_model_len, path, settings.model_name))
    return {"object": "list", "data": cards}


def model_card(
    name: str,
    settings: ServerSettings,
    max_model_len: int | None,
    root: str | None = None,
    parent: str | None = None,
) -> dict[str, Any]:
    created = now()
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": OWNER,
        # The model path (or hub id, or .gguf file) every served name stands for; a
        # LoRA adapter's folder.
        "root": root or settings.engine.model or settings.model_name,
        "parent": parent,  # a LoRA adapter's base model, as vLLM names it
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
