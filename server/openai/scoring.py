"""/v1/score and /rerank: texts scored against each other by the cosine similarity of
their embeddings, from the pooling path /v1/embeddings takes, as vLLM scores with an
embedding model. Each distinct text is embedded once, all of them in one batch of
engine requests beside generation."""

from __future__ import annotations

from typing import Any

from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.scoring_request import RerankRequest, ScoreRequest
from hetero_infer.server.serving.answer_parts import new_id, now
from hetero_infer.server.serving.request_context import RequestContext


async def embed(
    ctx: RequestContext, body: ScoreRequest | RerankRequest, texts: list[str], param: str
) -> tuple[dict[str, list[float]], int]:
    """Each distinct text's unit-length embedding, and the tokens embedded."""
    processor = ctx.engine.input_processor
    distinct = list(dict.fromkeys(texts))
    prompts = [processor.tokenize(text, param=param) for text in distinct]
    if body.truncate_prompt_tokens is not None:
        prompts = [processor.truncate(p, body.truncate_prompt_tokens) for p in prompts]
    base = new_id("score")
    requests = [
        processor.embedding_request(f"{base}-{i}", prompt, priority=body.priority)
        for i, prompt in enumerate(prompts)
    ]
    finals = await ctx.run_to_end(requests)
    vectors = {}
    for text, [output] in zip(distinct, finals, strict=True):
        assert output.embedding is not None, "an embedding request ended without one"
        vectors[text] = output.embedding
    return vectors, sum(len(prompt.token_ids) for prompt in prompts)


def similarity(a: list[float], b: list[float]) -> float:
    """Cosine similarity of two unit-length vectors."""
    return sum(x * y for x, y in zip(a, b, strict=True))


async def score(ctx: RequestContext, body: ScoreRequest) -> dict[str, Any]:
    try:
        pairs = body.pairs()
    except ValueError as exc:
        raise APIError(400, str(exc), param="text_2") from exc
    texts = [text for pair in pairs for text in pair]
    vectors, num_tokens = await embed(ctx, body, texts, "text_1")
    data = [
        {"index": i, "object": "score", "score": similarity(vectors[a], vectors[b])}
        for i, (a, b) in enumerate(pairs)
    ]
    return {
        "id": new_id("score"),
        "object": "list",
        "created": now(),
        "model": ctx.model_name,
        "data": data,
        "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens},
    }


async def rerank(ctx: RequestContext, body: RerankRequest) -> dict[str, Any]:
    documents = body.texts()
    texts = [body.query, *documents]
    vectors, num_tokens = await embed(ctx, body, texts, "documents")
    query = vectors[body.query]
    results = [
        {"index": i, "relevance_score": similarity(query, vectors[text])}
        for i, text in enumerate(documents)
    ]
    results.sort(key=lambda result: -result["relevance_score"])
    if body.top_n:
        results = results[: body.top_n]
    if body.return_documents:
        for result in results:
            result["document"] = {"text": documents[result["index"]]}
    return {
        "id": new_id("rerank"),
        "model": ctx.model_name,
        "usage": {"total_tokens": num_tokens},
        "results": results,
    }
