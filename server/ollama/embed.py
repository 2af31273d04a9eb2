"""/api/embed and the older /api/embeddings: each input becomes an embedding request,
served as /v1/embeddings' are (pooled final hidden states).

/api/embed's vectors have unit length, as Ollama's have. ``truncate`` (Ollama's
default) cuts an input longer than the context to its first max_model_len tokens;
``truncate: false`` refuses it with a 400. ``dimensions`` is accepted only as the
model's own size, as in /v1/embeddings.

/api/embeddings, which Ollama keeps for older clients, embeds one prompt, not scaled to
unit length (as Ollama's is not), and refuses a prompt longer than the context; an empty
prompt gets an empty embedding (Ollama's way to load a model).
"""

from __future__ import annotations

import time
from typing import Any

from hetero_infer.engine.frontend.input_processor import PromptTokens
from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.generation import nanoseconds
from hetero_infer.server.ollama.request_bodies import EmbeddingsRequest, EmbedRequest
from hetero_infer.server.serving.answer_parts import new_id
from hetero_infer.server.serving.request_context import RequestContext


async def embed(ctx: RequestContext, body: EmbedRequest, model: str) -> dict[str, Any]:
    start = time.monotonic()
    size = ctx.engine.model_config.hidden_size
    if body.dimensions is not None and body.dimensions != size:
        raise APIError(
            400,
            f"dimensions: this model's embeddings have {size} dimensions and cannot be "
            f"shortened (the model has no Matryoshka training); omit dimensions or give {size}",
            param="dimensions",
        )
    processor = ctx.engine.input_processor
    prompts = []
    for text in body.inputs():
        prompt = processor.tokenize(text, param="input")
        if body.truncate and len(prompt.token_ids) > processor.max_model_len:
            prompt = PromptTokens(None, prompt.token_ids[: processor.max_model_len])
        prompts.append(prompt)
    return {
        "model": model,
        "embeddings": await _vectors(ctx, prompts, normalize=True),
        "total_duration": nanoseconds(time.monotonic() - start),
        "load_duration": 0,
        "prompt_eval_count": sum(len(prompt.token_ids) for prompt in prompts),
    }


async def embeddings(ctx: RequestContext, body: EmbeddingsRequest) -> dict[str, Any]:
    if not body.prompt:
        return {"embedding": []}
    prompt = ctx.engine.input_processor.tokenize(body.prompt)
    [vector] = await _vectors(ctx, [prompt], normalize=False)
    return {"embedding": vector}


async def _vectors(
    ctx: RequestContext, prompts: list[PromptTokens], normalize: bool
) -> list[list[float]]:
    processor = ctx.engine.input_processor
    embedding_id = new_id("embed")
    requests = [
        processor.embedding_request(f"{embedding_id}-{i}", prompt, normalize)
        for i, prompt in enumerate(prompts)
    ]
    finals = await ctx.run_to_end(requests) if requests else []
    vectors = []
    for [output] in finals:
        assert output.embedding is not None, "an embedding request ended without one"
        vectors.append(output.embedding)
    return vectors
