"""/v1/models: the names the server answers to, each a card for the one model."""

from __future__ import annotations

from typing import Any

from hetero_infer.server.openai.responses import now
from hetero_infer.server.settings import ServerSettings


def model_list(settings: ServerSettings, max_model_len: int | None) -> dict[str, Any]:
    """``max_model_len`` is None while the model loads."""
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": now(),
                "owned_by": "hetero-paged-infer",
                "root": settings.engine.model or settings.model_name,
                "max_model_len": max_model_len,
            }
            for name in settings.model_names
        ],
    }
