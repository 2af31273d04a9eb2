"""The body of /v1/chat/completions: the chat request every family makes
(serving/chat_plan.py: messages, tools, the chat template's inputs, sampling), and the
fields only OpenAI's chat route has: max_completion_tokens, logprobs, and the fields
it refuses by name (unsupported_fields.py)."""

from __future__ import annotations

from hetero_infer.engine.params.sampling_params import MAX_LOGPROBS
from hetero_infer.server.errors import APIError
from hetero_infer.server.openai.unsupported_fields import CHAT
from hetero_infer.server.serving.chat_plan import ChatPlan
from pydantic import Field


class ChatCompletionRequest(ChatPlan):
    UNSUPPORTED = CHAT

    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # OpenAI's, which change nothing here: nothing is stored, and the prompt cache
    # needs no key (prefix caching finds shared prompts by their tokens).
    store: bool | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    # vLLM's: false leaves the reasoning parser's reasoning out of the answer.
    include_reasoning: bool = True
    # vLLM's: the answer starts with the last message's content where that message is
    # the assistant's (the one continue_final_message goes on with).
    echo: bool = False

    def requested_max_tokens(self) -> int | None:
        """OpenAI's newer name for the limit first, then the older max_tokens."""
        return self.max_completion_tokens or self.max_tokens

    def logprobs_params(self) -> dict[str, int]:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                400, "logprobs must be set to true if top_logprobs is used", param="top_logprobs"
            )
        return {"logprobs": self.top_logprobs or 0} if self.logprobs else {}
