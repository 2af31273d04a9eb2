"""LoRA adapters at run time, as vLLM serves them: POST /v1/load_lora_adapter and
/v1/unload_lora_adapter, and the ``model`` field that names an adapter.

Loading and unloading run on the engine's thread between steps (AsyncEngine.call), so
a step never sees an adapter half loaded. An adapter that cannot be served is refused
with a 400 naming the problem and changes nothing (with load_inplace too: the adapter
loaded under that name stays, serving); unloading one that is not loaded is a 404
(both as vLLM answers). An adapter unloaded while requests run on it lets them
finish; new requests naming it get the 404 of an unknown model.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.request_body import RequestBody

router = APIRouter()


class LoadLoRAAdapterRequest(RequestBody):
    lora_name: str
    lora_path: str
    load_inplace: bool = False  # vLLM's: replace a loaded adapter of that name


class UnloadLoRAAdapterRequest(RequestBody):
    lora_name: str
    lora_int_id: int | None = None  # vLLM's, unused: names are unique


def lora_not_enabled() -> APIError:
    return APIError(
        400,
        "LoRA adapters are not enabled on this server (start it with --enable-lora)",
        param="lora_name",
    )


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> str:
    state = request.app.state.server
    engine = state.require_engine()
    if engine.lora is None:
        raise lora_not_enabled()
    name, path = body.lora_name, body.lora_path
    if name in state.settings.model_names:
        raise APIError(400, f"{name!r} is the base model's name", param="lora_name")

    try:
        await engine.call(lambda llm: llm.adapters.load(name, path, body.load_inplace))
    except ValueError as exc:  # refused: nothing changed
        raise APIError.from_exception(exc) from exc
    return f"Success: LoRA adapter '{name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> str:
    engine = request.app.state.server.require_engine()
    if engine.lora is None:
        raise lora_not_enabled()
    try:
        await engine.call(lambda llm: llm.adapters.unload(body.lora_name))
    except ValueError as exc:  # not loaded: a 404
        raise APIError.from_exception(exc) from exc
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."
