"""A chat request's images: where its body gives them (ImageSource: a URL and the
part's place, which every error names) and their loading (load_images), before the request is
built, since fetching waits on the network and ChatRun.build does not wait.

Every family says where its own images are (OpenAI's image_url parts, the Responses
API's input_image parts, Anthropic's image blocks, Ollama's images) in its own field
names, and writes them into the ChatPlan's messages as image_url parts, in the same
order: image i of the list is the i-th image marker the chat template writes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import blake3
from hetero_infer.engine.multimodal.image_prompts import ImagePrompts
from hetero_infer.engine.multimodal.recent_images import PreparedImage
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.chat_messages import ChatMessage
from hetero_infer.server.serving.image_decode import decode_image
from hetero_infer.server.serving.media_fetch import read_media
from hetero_infer.server.serving.request_context import RequestContext
from hetero_infer.server.settings import ServerSettings

# Images fetched and decoded at once for one request: a request naming a hundred URLs
# must not open a hundred connections and decode on every thread.
MAX_CONCURRENT_LOADS = 4

T = TypeVar("T")


@dataclass(frozen=True)
class ImageSource:
    """One image a request gives: its URL (data:, http(s) or file://) and its place in
    the body, in the family's own names (``messages.0.content.1``)."""

    url: str
    param: str


def image_sources(messages: Sequence[ChatMessage], param: str = "messages") -> list[ImageSource]:
    """The image_url parts of OpenAI-shaped messages, in order."""
    return [
        ImageSource(part["image_url"]["url"], f"{param}.{i}.content.{j}")
        for i, message in enumerate(messages)
        for j, part in enumerate(message.content if isinstance(message.content, list) else [])
        if part["type"] == "image_url"
    ]


def image_url_part(url: str) -> dict[str, object]:
    """The ChatPlan's image part (OpenAI's) for an image at ``url``."""
    return {"type": "image_url", "image_url": {"url": url}}


async def load_images(
    ctx: RequestContext,
    parts: Sequence[ImageSource],
    processor_kwargs: Mapping[str, Any] | None = None,
) -> list[PreparedImage]:
    """The images read, decoded and preprocessed (with vLLM's ``mm_processor_kwargs``
    where the request gives them), in order. A model that takes no images refuses them
    first, and so does a request holding more than --limit-mm-per-prompt allows, or
    settings the processor does not take, before any is fetched (no request to anywhere
    for a request that cannot run)."""
    if not parts:
        return []
    prompts = ctx.engine.input_processor.image_prompts
    if prompts is None:  # a text-only model
        first = parts[0].param
        raise APIError(
            400,
            f"{first}: this model takes no image input ({len(parts)} image(s) given)",
            param=first,
        )
    check_image_limit(parts, ctx.settings)
    if processor_kwargs:
        try:
            prompts = prompts.with_overrides(processor_kwargs)
        except ConfigError as exc:
            raise APIError(400, str(exc), param="mm_processor_kwargs") from exc
    return await prepared_images(parts, ctx.settings, functools.partial(prepared_image, prompts))


def check_image_limit(parts: Sequence[ImageSource], settings: ServerSettings) -> None:
    """A 400 naming the first image past --limit-mm-per-prompt's "image" limit (vLLM's
    limit: the prompt's images in all, every message's counted)."""
    limit = settings.limit_mm_per_prompt["image"]
    if len(parts) > limit:
        over = parts[limit].param
        raise APIError(
            400,
            f"{over}: at most {limit} image(s) per prompt (--limit-mm-per-prompt), "
            f"{len(parts)} given",
            param=over,
        )


async def prepared_images(
    parts: Sequence[ImageSource], settings: ServerSettings, prepare: Callable[[bytes, str], T]
) -> list[T]:
    """Each input read (under the server's rules on fetching) and prepared, a few at
    once; the first error ends the rest."""
    limit = asyncio.Semaphore(MAX_CONCURRENT_LOADS)

    async def load(one: ImageSource) -> T:
        async with limit:
            return await load_image(one, settings, prepare)

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(load(one)) for one in parts]
    except* APIError as errors:
        raise errors.exceptions[0] from None
    return [task.result() for task in tasks]


async def load_image(
    one: ImageSource, settings: ServerSettings, prepare: Callable[[bytes, str], T]
) -> T:
    """The image's bytes read, then ``prepare``d (decoded and more: milliseconds of CPU)
    off the event loop."""
    data = await read_media(one.url, settings, one.param)
    return await asyncio.to_thread(prepare, data, one.param)


def prepared_image(prompts: ImagePrompts, data: bytes, param: str) -> PreparedImage:
    """The image in ``data`` decoded and preprocessed for the model; the same bytes as
    a recent image's (a chat sends its images again each turn) are neither decoded nor
    hashed pixel by pixel again."""
    source = blake3.blake3(data).digest()
    prepared = prompts.recent.get(prompts.file_hash(source))
    if prepared is not None:
        return prepared
    image = decode_image(data, param)
    try:
        return prompts.preprocess(image, source)
    except (ValueError, OSError) as exc:
        raise APIError(400, f"{param}: {exc}", param=param) from exc
