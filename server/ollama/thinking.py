"""``think``: whether the model thinks, and where its thinking goes.

- unset: as the server is started: with ``--reasoning-parser``, the thinking goes to
  ``thinking`` and the answer to ``content`` / ``response``.
- true (or an effort level): needs that parser; the template gets ``enable_thinking``
  (and ``reasoning_effort`` for a level), as templates of thinking models read them.
- false: the template gets ``enable_thinking: false`` and the output is not split.
A JSON format constrains the output from its first token: there is no thinking to
split off then.
"""

from __future__ import annotations

from typing import Any

from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.request_bodies import GenerationBody
from hetero_infer.server.settings import ServerSettings


def thinking(body: GenerationBody, settings: ServerSettings) -> tuple[str | None, dict[str, Any]]:
    """(the reasoning parser to split the output with, the template's variables)."""
    parser = settings.reasoning_parser if body.format is None or body.format == "" else None
    if body.think is None:
        return parser, {}
    if body.think is False:
        return None, {"enable_thinking": False}
    if settings.reasoning_parser is None:
        raise APIError(
            400,
            "think: this server splits thinking from the answer only when started with "
            "--reasoning-parser",
            param="think",
        )
    kwargs: dict[str, Any] = {"enable_thinking": True}
    if isinstance(body.think, str):
        kwargs["reasoning_effort"] = body.think
    return parser, kwargs
