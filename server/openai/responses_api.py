"""/v1/responses (OpenAI's Responses API): a conversation of items becomes one chat
request, its output a response object of output items, whole or streamed as events.

The serving layer's ChatRun builds and checks the engine request (ChatRun.build:
template, tools, reasoning, sampling, the schema's grammar) and parses each piece of
text (its ChatOutputParser), as for the chat route; here that becomes the Responses API's shapes
(responses_api_output.py) and the conversation is kept for ``previous_response_id``
(responses_api_store.py). The chat route's errors name the chat fields; ``_renamed``
gives them the Responses API's names.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.settings.exceptions import EngineError
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.responses_api_items import (
    chat_messages,
    item_dicts,
    item_images,
    parse_items,
)
from hetero_infer.server.openai.responses_api_output import Event, OutputItems, item_id
from hetero_infer.server.openai.responses_api_request import ResponsesRequest
from hetero_infer.server.openai.responses_api_store import ResponseStore, StoredResponse
from hetero_infer.server.serving.answer_parts import new_id, now, prepend
from hetero_infer.server.serving.chat_images import ImageSource, load_images
from hetero_infer.server.serving.chat_output import MessageDelta
from hetero_infer.server.serving.chat_run import ChatRun
from hetero_infer.server.serving.reasoning import end_mark_tokens, reasoning_token_count
from hetero_infer.server.serving.request_context import RequestContext

# The chat request's field names -> the Responses API's, for errors.
_RENAMED_PARAMS = {
    "messages": "input",
    "response_format": "text.format",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
}
_NESTED_FUNCTION = re.compile(r"^tools\.(\d+)\.function\.")
# An engine finish_reason -> the response's incomplete_details.reason.
_INCOMPLETE_REASONS = {"length": "max_output_tokens", "abort": "timeout"}
# The engine ends a request with "error" only where its grammar failed: a constraint
# that compiled and passed its first tokens, then (on the path this output took) had
# more alternatives at one point than llguidance takes or forced an endless output.
_CONSTRAINT_FAILED = (
    "the output's constraint failed during generation, so the output stops short: "
    "it has more alternatives at one point than the grammar engine takes (2000), or "
    "forces an output that never ends"
)


class ResponsesAnswer:
    """One /v1/responses request: its ChatRun, and the answer."""

    def __init__(
        self,
        ctx: RequestContext,
        body: ResponsesRequest,
        run: ChatRun,
        conversation: list[dict[str, Any]],
        store: ResponseStore,
    ) -> None:
        self.ctx = ctx
        self.body = body
        self.run = run
        self.conversation = conversation
        self.store = store
        self.response_id = item_id("resp")
        self.created_at = now()

    @classmethod
    async def build(
        cls, ctx: RequestContext, body: ResponsesRequest, store: ResponseStore
    ) -> ResponsesAnswer:
        """The body checked, the earlier conversation prepended, its images loaded, and
        the chat request built from it (which checks the rest)."""
        history: list[dict[str, Any]] = []
        if body.previous_response_id is not None:
            previous = store.get(body.previous_response_id)
            if previous is None:
                shown = body.previous_response_id[:64]
                raise APIError(
                    400,
                    f"Previous response with id '{shown}' not found.",
                    param="previous_response_id",
                    code="previous_response_not_found",
                )
            history = previous.conversation
        earlier, given = parse_items(history), parse_items(body.input)
        items = earlier + given
        # An earlier turn's images are read again: the store keeps their URLs.
        sources = [
            ImageSource(source.url, "previous_response_id") for source in item_images(earlier)
        ] + item_images(given)
        try:
            chat = body.chat_request(chat_messages(items))
        except APIError as error:
            raise _renamed(error) from None
        images = await load_images(ctx, sources)
        try:
            run = ChatRun.build(ctx, chat, new_id("chatcmpl"), images)
        except APIError as error:
            raise _renamed(error) from None
        except EngineError as exc:
            raise _renamed(APIError.from_exception(exc)) from None
        return cls(ctx, body, run, [*history, *item_dicts(items[len(history) :])], store)

    async def whole(self) -> dict[str, Any]:
        [[final]] = await self.ctx.run_to_end([self.run.request])
        output = OutputItems()
        output.feed(self.run.output_parser().parse(final.text))
        status = _status(final)
        output.finish(status)
        return self._finished(final, status, output.items, list(final.token_ids))

    async def chunks(self) -> AsyncIterator[Event]:
        outputs = self.ctx.outputs(self.run.request)
        # The first events wait for the engine's first output (as the chat route's
        # role chunks do): until then the request may still be refused.
        first = await anext(outputs)
        opening = self._body("in_progress", [])
        yield {"type": "response.created", "response": opening}
        yield {"type": "response.in_progress", "response": opening}
        parser = self.run.output_parser()
        output = OutputItems()
        output_ids: list[int] = []
        async for out in prepend(first, outputs):  # deltas
            output_ids += out.delta_token_ids
            delta = parser.feed(out.delta_text) if out.delta_text else MessageDelta()
            if out.finished:
                delta.add(parser.finish())
            for event in output.feed(delta):
                yield event
            if out.finished:
                status = _status(out)
                for event in output.finish(status):
                    yield event
                body = self._finished(out, status, output.items, output_ids)
                yield {"type": f"response.{status}", "response": body}

    def _finished(
        self,
        final: RequestOutput,
        status: str,
        items: list[dict[str, Any]],
        output_ids: list[int],
    ) -> dict[str, Any]:
        """The finished response's body, kept in the store where the request asks."""
        usage = self._usage(output_ids, final.num_cached_tokens, items)
        body = self._body(status, items, _incomplete_details(final), usage)
        if status == "failed":
            body["error"] = self._constraint_error()
        if self.body.store:
            # A call cut off by max_output_tokens has no arguments object to render.
            kept = [i for i in items if i["type"] != "function_call" or i["status"] == "completed"]
            conversation = [*self.conversation, *kept]
            self.store.put(self.response_id, StoredResponse(body, conversation))
        return body

    def _usage(
        self, output_ids: list[int], cached_tokens: int, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The finished response's usage: the prompt tokens and those of them the prefix
        cache held; the output tokens and those of them that are the model's thinking
        (where the reasoning parser found any: through its end mark)."""
        input_tokens = self.run.prompt_tokens
        thinking = 0
        if any(item["type"] == "reasoning" for item in items):
            end_mark = end_mark_tokens(self.ctx.engine.tokenizer)
            thinking = reasoning_token_count(output_ids, end_mark, reasoned=True)
        return {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": len(output_ids),
            "output_tokens_details": {"reasoning_tokens": thinking},
            "total_tokens": input_tokens + len(output_ids),
        }

    def _constraint_error(self) -> dict[str, Any]:
        """A failed response's ``error`` (OpenAI's: code and message), naming the
        field whose constraint failed."""
        param = "tools" if self.run.tools.json_schema is not None else "text.format"
        return {"code": "server_error", "message": f"{param}: {_CONSTRAINT_FAILED}", "param": param}

    def _body(
        self,
        status: str,
        items: list[dict[str, Any]],
        incomplete_details: dict[str, str] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The response object; ``usage`` once it has finished."""
        body = self.body
        params = self.run.request.params
        tool_choice: Any = body.tool_choice or ("auto" if body.tools else "none")
        if not isinstance(tool_choice, str):
            tool_choice = tool_choice.model_dump()
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": incomplete_details,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.ctx.model_name,
            "output": items,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": body.previous_response_id,
            "reasoning": body.reasoning.model_dump() if body.reasoning else None,
            "store": body.store,
            "temperature": params.temperature,
            "text": {"format": (body.text.format if body.text else None) or {"type": "text"}},
            "tool_choice": tool_choice,
            "tools": [tool.model_dump() for tool in body.tools or []],
            "top_p": params.top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": body.user,
            "safety_identifier": body.safety_identifier,
            "prompt_cache_key": body.prompt_cache_key,
            "metadata": body.metadata or {},
        }


def stored_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    """GET /v1/responses/{id}: a stored response, or a 404."""
    entry = store.get(response_id)
    if entry is None:
        raise APIError(
            404,
            f"Response with id '{response_id[:64]}' not found.",
            "not_found_error",
            param="response_id",
        )
    return entry.body


def deleted_response(store: ResponseStore, response_id: str) -> dict[str, Any]:
    """DELETE /v1/responses/{id}: forget a stored response, or a 404."""
    stored_response(store, response_id)
    store.delete(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _status(final: RequestOutput) -> str:
    if final.finish_reason == "error":
        return "failed"
    return "incomplete" if final.finish_reason in _INCOMPLETE_REASONS else "completed"


def _incomplete_details(final: RequestOutput) -> dict[str, str] | None:
    reason = _INCOMPLETE_REASONS.get(final.finish_reason or "")
    return {"reason": reason} if reason else None


def _renamed(error: APIError) -> APIError:
    """A chat route's error with the Responses API's field names."""
    param = error.param
    if param is not None:
        head = param.split(".", 1)[0]
        param = _RENAMED_PARAMS.get(head) or _NESTED_FUNCTION.sub(r"tools.\1.", param)
    message = error.message.replace("response_format", "text.format")
    message = message.replace("max_completion_tokens", "max_output_tokens")
    return APIError(error.status_code, message, error.type, param, error.code, error.headers)
