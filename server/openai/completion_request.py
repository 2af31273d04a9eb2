"""The body of /v1/completions: the shared sampling fields, the prompt, and the
fields of its own (echo, integer logprobs, suffix)."""

from __future__ import annotations

from typing import Annotated

from hetero_infer.engine.params.sampling_params import MAX_LOGPROBS
from hetero_infer.server.openai.prompt_field import PromptField, check_prompts, prompt_list
from hetero_infer.server.openai.unsupported_fields import COMPLETION
from hetero_infer.server.serving.sampling_fields import SamplingFields
from pydantic import Field, WithJsonSchema, field_validator


class CompletionRequest(SamplingFields):
    UNSUPPORTED = COMPLETION

    prompt: PromptField
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    # Not supported: only an empty one is accepted.
    suffix: Annotated[str | None, WithJsonSchema({"enum": ["", None]})] = None
    # OpenAI caps this at 5; vLLM's default max_logprobs is 20.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # vLLM's: a text prompt gets the model's special tokens (a BOS...); false for a
    # prompt that holds them already (a chat template rendered by the client).
    add_special_tokens: bool = True

    def logprobs_params(self) -> dict[str, int]:
        if self.logprobs is None:
            return {}
        values = {"logprobs": self.logprobs}
        if self.echo:
            values["prompt_logprobs"] = self.logprobs
        return values

    @field_validator("prompt")
    @classmethod
    def _valid_prompts(cls, value: PromptField) -> PromptField:
        return check_prompts(value, "prompt")

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (text or token ids)."""
        return prompt_list(self.prompt)
