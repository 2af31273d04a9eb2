"""InputProcessor: the one path by which a prompt and its parameters are checked and
tokenized, for the engine's own add_request and for the server's routes alike.

Every check that needs the model (the vocabulary, the context length, the tokenizer, a
JSON schema's grammar) is here; what SamplingParams can check alone it checks itself.
A bad request raises ValidationError naming the field. Each check runs once: the
EngineRequest that comes out is queued as it is (LLMEngine.add_processed).

The two callers differ only in the context-length rule: the engine's own requests may
ask for more tokens than the context has left (they end with "length" there), while the
server refuses such a request up front, as OpenAI does (``fit_context``). An embedding
request generates nothing, so its prompt may fill the whole context.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.lora import LoRARequest
from hetero_infer.engine.multimodal.image_prompts import ImagePrompts
from hetero_infer.engine.params.image_input import ImageInput
from hetero_infer.engine.params.pooling_params import PoolingParams
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.params.structured_output import StructuredOutput
from hetero_infer.engine.settings.exceptions import ContextLengthError, ValidationError
from hetero_infer.engine.tokenizer import Tokenizer

Prompt = str | list[int]


@dataclass(frozen=True)
class PromptTokens:
    """A prompt the processor has checked: its text (None when it came as token ids)
    and its token ids, none empty and all in the vocabulary."""

    text: str | None
    token_ids: list[int]
    # The images whose embeddings replace their placeholder tokens (with_images).
    images: tuple[ImageInput, ...] = ()


@dataclass(frozen=True)
class EngineRequest:
    """A checked request, ready for the engine: its tokens and params, its response_format's
    grammar (built once; None without one), priority and deadline (None: no time limit)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    grammar: Any = None
    # An embedding request: how its final hidden states are pooled (None: generation).
    pooling: PoolingParams | None = None
    priority: int = 0
    deadline: float | None = None  # the time.monotonic() by which it must end
    # The LoRA adapter it runs with (None: the base model).
    lora: LoRARequest | None = None
    # Its images, whose embeddings the runner puts at their placeholder tokens.
    images: tuple[ImageInput, ...] = ()


class InputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        structured_output: StructuredOutput,
        vocab_size: int,
        max_model_len: int,
        pooling: str = "last",
        scheduling_policy: str = "fcfs",
        request_timeout: float | None = None,  # the time limit of every request (s)
        image_prompts: ImagePrompts | None = None,  # a vision model's (None: text only)
    ) -> None:
        self.tokenizer = tokenizer
        self.structured_output = structured_output
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.pooling = pooling
        self.scheduling_policy = scheduling_policy
        self.request_timeout = request_timeout
        self.image_prompts = image_prompts

    def process(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams,
        priority: int = 0,
        timeout: float | None = None,
        lora: LoRARequest | None = None,
    ) -> EngineRequest:
        """The engine's own path (LLMEngine.add_request): the prompt must fit in the
        context; max_tokens may run past it."""
        if not isinstance(params, SamplingParams):
            raise ValidationError(
                "sampling_params must be a SamplingParams", param="sampling_params"
            )
        checked = self.tokenize(prompt)
        return self.request(request_id, checked, params, priority, timeout, lora=lora)

    def tokenize(
        self, prompt: Prompt, param: str = "prompt", add_special_tokens: bool = True
    ) -> PromptTokens:
        """The prompt's tokens (text is encoded, with the model's special tokens where
        ``add_special_tokens``; token ids taken as they are), checked against the model;
        errors name ``param``, the field the prompt came in."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValidationError(f"{param} must not be empty", param=param)
            token_ids = self.tokenizer.encode(prompt, add_special_tokens)
            text: str | None = prompt
        elif isinstance(prompt, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            token_ids, text = list(prompt), None
        else:
            raise ValidationError(f"{param} must be a string or a list of token ids", param=param)
        if not token_ids:
            raise ValidationError(f"{param} must not be empty", param=param)
        # (Encoded text too: a plugged-in tokenizer may not fit the model.)
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValidationError(
                f"{param}: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                param=param,
            )
        return PromptTokens(text, token_ids)

    def with_images(
        self, prompt: PromptTokens, images: Sequence[Any], param: str = "messages"
    ) -> PromptTokens:
        """The prompt with each image's marker expanded into its placeholder tokens
        (``images``: PIL images, or ImagePrompts.preprocess's of them, in order); a 400
        naming ``param`` for a text model."""
        if not images:
            return prompt
        if self.image_prompts is None:
            raise ValidationError(
                f"this model takes no image input ({len(images)} image(s) given)", param=param
            )
        token_ids, inputs = self.image_prompts.expand(prompt.token_ids, images, param)
        return PromptTokens(prompt.text, token_ids, inputs)

    def bad_words_token_ids(self, words: list[str]) -> list[list[int]]:
        """Each bad word's tokens, as it starts a text and as it follows a space (most
        tokenizers give those different first tokens)."""
        found: list[list[int]] = []
        for word in words:
            for text in (word.lstrip(), " " + word.lstrip()):
                ids = self.tokenizer.encode(text, add_special_tokens=False)
                if ids and ids not in found:
                    found.append(ids)
        return found

    def truncate(self, prompt: PromptTokens, keep: int) -> PromptTokens:
        """The prompt's last ``keep`` tokens (-1: as many as the context holds), as
        vLLM's truncate_prompt_tokens keeps them; a prompt cut loses its text."""
        keep = self.max_model_len if keep == -1 else keep
        if keep <= 0:
            raise ValidationError(
                "truncate_prompt_tokens must be -1 or at least 1", param="truncate_prompt_tokens"
            )
        if len(prompt.token_ids) <= keep:
            return prompt
        if prompt.images:
            raise ValidationError(
                f"truncate_prompt_tokens ({keep}) would cut a prompt that holds images",
                param="truncate_prompt_tokens",
            )
        return PromptTokens(None, prompt.token_ids[-keep:])

    def fit_context(self, prompt: PromptTokens, max_tokens: int | None) -> int:
        """OpenAI's context rule, as the server applies it: the prompt and max_tokens
        together fit in max_model_len, and the prompt leaves room for a token. Returns
        the max_tokens to use (without one, what the context has left);
        ContextLengthError in OpenAI's words otherwise."""
        limit = self.max_model_len
        num_prompt_tokens = len(prompt.token_ids)
        requested = num_prompt_tokens + (max_tokens or 0)
        if requested > limit or num_prompt_tokens >= limit:
            asked = f"{num_prompt_tokens} in the messages/prompt"
            if max_tokens:
                asked += f" and {max_tokens} for the completion"
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {requested} tokens ({asked}). "
                "Please reduce the length of the messages or completion.",
                param="messages" if max_tokens is None else "max_tokens",
            )
        return max_tokens or limit - num_prompt_tokens

    def request(
        self,
        request_id: str,
        prompt: PromptTokens,
        params: SamplingParams,
        priority: int = 0,
        timeout: float | None = None,
        schema_param: str = "response_format",
        lora: LoRARequest | None = None,
    ) -> EngineRequest:
        """The request for a checked prompt (as the engine gets it, images expanded: it
        must fit in the context), once its params pass the model's checks: token ids
        the params name must be in the vocabulary, and a JSON schema or structured
        output must compile (an error names ``schema_param``, the field it came from);
        its grammar (an llguidance matcher) is built here, once.

        ``priority`` needs the priority policy unless it is 0 (as in vLLM). ``timeout``
        (seconds from now) can shorten the engine's request_timeout, not lengthen it.
        """
        if len(prompt.token_ids) > self.max_model_len:
            too_long = f"prompt: {len(prompt.token_ids)} tokens is longer than max_model_len"
            raise ValidationError(f"{too_long} ({self.max_model_len})", param="prompt")
        self._check_priority(priority)
        deadline = self._deadline(timeout)
        if params.bad_words:
            params = dataclasses.replace(
                params, bad_words_token_ids=self.bad_words_token_ids(params.bad_words)
            )
        params.check_vocab(self.vocab_size)
        grammar = None
        if params.json_schema is not None:
            grammar = self.structured_output.matcher(params.json_schema, schema_param)
        elif params.structured_outputs is not None:
            grammar = self.structured_output.guided_matcher(params.structured_outputs, schema_param)
        if grammar is not None and params.thinking_budget is not None:
            # A constrained output has no thinking section to end.
            raise ValidationError(
                f"thinking_token_budget cannot be used with {schema_param}",
                param="thinking_token_budget",
            )
        return EngineRequest(
            request_id,
            prompt.text,
            prompt.token_ids,
            params,
            grammar,
            priority=priority,
            deadline=deadline,
            lora=lora,
            images=prompt.images,
        )

    def embedding_request(
        self, request_id: str, prompt: PromptTokens, normalize: bool = True, priority: int = 0
    ) -> EngineRequest:
        """An embedding request for a checked prompt, pooled as EngineConfig.pooling
        says, to unit length where ``normalize``; it ends with its prefill."""
        num_tokens = len(prompt.token_ids)
        if num_tokens > self.max_model_len:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_model_len} tokens. However, "
                f"the input has {num_tokens} tokens. Please reduce the length of the input.",
                param="input",
            )
        self._check_priority(priority)
        pooling = PoolingParams(self.pooling, normalize)
        params = SamplingParams(max_tokens=1)  # nothing is sampled: only the defaults
        return EngineRequest(
            request_id,
            prompt.text,
            prompt.token_ids,
            params,
            pooling=pooling,
            priority=priority,
            images=prompt.images,
        )

    def _check_priority(self, priority: int) -> None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValidationError(
                f"priority must be an integer, got {priority!r}", param="priority"
            )
        if priority != 0 and self.scheduling_policy != "priority":
            raise ValidationError(
                f"priority {priority} needs priority scheduling, which is not enabled "
                "(start the server with --scheduling-policy priority)",
                param="priority",
            )

    def _deadline(self, timeout: float | None) -> float | None:
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 < timeout < float("inf")
        ):
            raise ValidationError(
                f"timeout must be a number of seconds > 0, got {timeout!r}", param="timeout"
            )
        limits = [t for t in (timeout, self.request_timeout) if t is not None]
        return time.monotonic() + min(limits) if limits else None
