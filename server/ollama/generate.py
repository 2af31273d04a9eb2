"""/api/generate: a prompt, through the chat template as one user message (after the
``system`` message, when given), or as it is with ``raw``; a previous answer's
``context`` goes before it.

``template`` is Ollama's Go template, which we cannot render: it is accepted only
empty or as the server's own chat template (what /api/show gives). ``system`` and
``template`` have no effect with ``raw`` and are refused there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hetero_infer.engine.frontend.input_processor import PromptTokens
from hetero_infer.engine.multimodal.recent_images import PreparedImage
from hetero_infer.server.errors import APIError
from hetero_infer.server.ollama.generation import Generation
from hetero_infer.server.ollama.request_bodies import GenerateRequest
from hetero_infer.server.ollama.sampling import engine_request, sampling_values, validated
from hetero_infer.server.ollama.thinking import thinking
from hetero_infer.server.serving.chat_images import ImageSource
from hetero_infer.server.serving.chat_output import ChatOutputParser
from hetero_infer.server.serving.reasoning import reasoning_parser
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.serving.sampling_fields import SamplingFields


def build_generate(
    ctx: RequestContext, body: GenerateRequest, model: str, images: Sequence[PreparedImage] = ()
) -> Generation:
    """``images``: the body's (image_sources), loaded."""
    start = time.monotonic()
    reasoning, template_kwargs = thinking(body, ctx.settings)
    fields = validated(SamplingFields, sampling_values(body))
    processor = ctx.engine.input_processor
    if body.raw:
        for name in ("system", "template"):
            if getattr(body, name):
                raise APIError(400, f"{name} has no effect with raw: true", param=name)
        prompt = processor.tokenize(body.prompt) if body.prompt else None
        reasoning = None  # a raw prompt is the caller's own: its output is not split
    else:
        _check_template(ctx, body.template)
        messages: list[dict[str, Any]] = []
        if body.system:
            messages.append({"role": "system", "content": body.system})
        assert len(images) == len(image_sources(body)), "the body's images are loaded first"
        # The images first, then the prompt, as Ollama lays them out; each image as the
        # part for which the template writes an image marker (chat_messages.py).
        text = [{"type": "text", "text": body.prompt}] if body.prompt else []
        content = [*({"type": "image"} for _ in images), *text] if images else body.prompt
        messages.append({"role": "user", "content": content})
        token_ids = ctx.chat_prompt(messages, template_kwargs=template_kwargs or None)
        prompt = processor.with_images(processor.tokenize(token_ids), images)
    if body.context:
        ids = [*body.context, *(prompt.token_ids if prompt else [])]
        prompt = processor.tokenize(ids, param="context")
    assert prompt is not None, "the router answers a request with nothing to generate"
    request = engine_request(ctx, body, fields, PromptTokens(None, prompt.token_ids, prompt.images))

    def new_parser() -> ChatOutputParser:
        return ChatOutputParser(reasoning_parser(reasoning) if reasoning else None)

    return Generation(
        ctx,
        request,
        model,
        new_parser,
        chat=False,
        returns_context=not body.raw,
        top_logprobs=body.top_logprobs_count(),
        start=start,
    )


def image_sources(body: GenerateRequest) -> list[ImageSource]:
    """The body's images: they go through the chat template with the prompt, so not
    with ``raw``, nor with ``context`` (an earlier answer's tokens, whose images are
    not kept)."""
    if not body.images:
        return []
    for name in ("raw", "context"):
        if getattr(body, name):
            raise APIError(400, f"images cannot be given with {name}", param="images")
    return [
        ImageSource(f"data:;base64,{image}", f"images.{k}") for k, image in enumerate(body.images)
    ]


def _check_template(ctx: RequestContext, template: str | None) -> None:
    if not template or template == own_template(ctx):
        return
    raise APIError(
        400,
        "template: Ollama's Go templates are not supported; the model's chat template "
        "(see /api/show) is used",
        param="template",
    )


def own_template(ctx: RequestContext) -> str | None:
    """The chat template the server renders with."""
    if ctx.settings.chat_template_text:
        return ctx.settings.chat_template_text
    hf = ctx.engine.tokenizer.hf_tokenizer
    template = getattr(hf, "chat_template", None) if hf is not None else None
    return template if isinstance(template, str) else None
