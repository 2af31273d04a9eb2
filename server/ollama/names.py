"""Model names as Ollama clients write them: ``name:tag``, the tag ``latest`` when
none is given. The served names answer with or without ``:latest``."""

from __future__ import annotations

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.request_context import echoed
from hetero_infer.server.settings import ServerSettings

LATEST = ":latest"


def tagged(name: str) -> str:
    """A served name as Ollama lists it: with its tag, ``:latest`` where it has none."""
    return name if ":" in name else name + LATEST


def check_model_name(settings: ServerSettings, name: str) -> str:
    """``name`` if the server answers to it, else a 404 as Ollama words it."""
    served = settings.model_names
    untagged = name.removesuffix(LATEST)
    if name in served or untagged in served:
        return name
    raise APIError(
        404,
        f'model "{echoed(name)}" not found (this server serves {", ".join(map(tagged, served))})',
        "not_found_error",
        param="model",
    )
