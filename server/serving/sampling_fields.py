"""vLLM's sampling fields and their mapping to SamplingParams: what every family's
request maps onto (OpenAI's completion and chat bodies extend SamplingFields; Anthropic's
and Ollama's bodies are translated into it).

The fields are OpenAI's and vLLM's extras (top_k, min_p, ignore_eos, min_tokens,
stop_token_ids, include_stop_str_in_output, repetition_penalty, skip_special_tokens,
priority, structured outputs: guided_fields.py), and this server's own time limit
(timeout). A field a route does not implement yet is refused with a 400 naming it rather
than ignored (its body's UNSUPPORTED: OpenAI's routes list theirs in
server/openai/unsupported_fields.py): a client must never get silently different
behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from hetero_infer.engine.entrypoints.beam_search import BeamSearchParams
from hetero_infer.engine.frontend.input_processor import InputProcessor, PromptTokens
from hetero_infer.engine.params.sampling_params import (
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_N,
    RequestOutputKind,
    SamplingParams,
)
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.guided_fields import GuidedDecodingFields
from hetero_infer.server.serving.request_body import NULL_SCHEMA, TokenId
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)

INT64_MAX = 2**63 - 1

# Schemas of the fields checked by hand (request_body.py says why they are written out).
# Token ids (as JSON object keys) -> biases, which SamplingParams bounds.
LOGIT_BIAS_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]+$"},
            "additionalProperties": {
                "type": "number",
                "minimum": -MAX_LOGIT_BIAS,
                "maximum": MAX_LOGIT_BIAS,
            },
        },
        NULL_SCHEMA,
    ]
}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    # vLLM's: with include_usage, every chunk carries the usage so far.
    continuous_usage_stats: bool = False


class SamplingFields(GuidedDecodingFields):
    """The sampling fields every family's request maps onto."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # Bounded to int64: the sampler makes tensors and generators of them, and an
    # overflow there would kill the engine loop for every request.
    top_k: int | None = Field(default=None, ge=-1, le=INT64_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = Field(default=None, ge=0, le=INT64_MAX)
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    min_tokens: int = Field(default=0, ge=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    logit_bias: Annotated[dict[str, float] | None, WithJsonSchema(LOGIT_BIAS_SCHEMA)] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM's: false keeps special tokens in the text, and then false here writes two
    # added tokens in a row without the space some decoders put between them.
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # OpenAI's, which change nothing here: an end user's id, and the processing tier.
    user: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    n: int = Field(default=1, ge=1, le=MAX_N)
    # vLLM's v1 engine has no best_of either: only 1 is accepted.
    best_of: Annotated[int | None, WithJsonSchema({"enum": [1, None]})] = None
    # vLLM's: with --scheduling-policy priority, lower values are served first (and
    # preempt running requests of higher values); any other value needs that policy.
    priority: int = 0
    # This server's own (vLLM, TGI and OpenAI have no such field): seconds the request
    # may take from its arrival, queueing included; it can shorten --request-timeout.
    timeout: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    # vLLM's, for training and evaluation tools: the prompt's and each choice's token
    # ids in the answer (a stream: the prompt's in its first chunk, each chunk's own);
    # logprobs' tokens as "token_id:<id>", which any token can be written as.
    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    # vLLM's: each prompt token's logprob, rank and this many alternatives, from the
    # prefill (a request that asks computes its whole prompt: no prefix-cache hits).
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    # vLLM's: the answer's id is made of it ("cmpl-<id>", "chatcmpl-<id>"); and the
    # prompt cut to its last tokens (-1: to what the context holds).
    request_id: str | None = Field(default=None, min_length=1, max_length=256)
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # vLLM's: only requests with the same salt share prefix-cache blocks.
    cache_salt: str | None = Field(default=None, min_length=1)
    # vLLM's: the only tokens the output may hold; words it may not hold.
    allowed_token_ids: list[TokenId] | None = Field(default=None, min_length=1)
    bad_words: list[str] | None = None
    # vLLM's: the most tokens a thinking section may hold before its end is forced
    # (RequestContext.thinking_budget; the marks are the reasoning parser's).
    thinking_token_budget: int | None = Field(default=None, ge=0)
    # vLLM's beam search (engine/entrypoints/beam_search.py), n beams wide; the n best come back.
    use_beam_search: bool = False
    length_penalty: float = Field(default=1.0, allow_inf_nan=False)
    early_stopping: StrictBool | Literal["never"] = False

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _early_stopping(cls, value: Any) -> Any:
        """One message naming the field, not one per member of the union."""
        if value is True or value is False or value == "never":
            return value
        raise ValueError('must be true, false or "never"')

    @field_validator("stream_options")
    @classmethod
    def _only_with_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> Any:
        """As OpenAI and vLLM: options of a stream need a stream."""
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed with stream: true")
        return value

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every chunk of a stream carries the usage so far (as in vLLM, only
        together with include_usage)."""
        return self.include_usage and bool(
            self.stream_options and self.stream_options.continuous_usage_stats
        )

    def unsupported(self) -> None:
        """Raise a 400 for any field set to something we cannot honour."""
        if self.best_of not in (None, 1):
            raise APIError(
                400,
                "'best_of' greater than 1 is not supported (nor by vLLM's v1 engine); "
                "use 'n' for several choices",
                param="best_of",
            )
        if self.use_beam_search:
            raise APIError(400, "'use_beam_search' is not supported here", param="use_beam_search")
        for name, neutral in (("length_penalty", 1.0), ("early_stopping", False)):
            if getattr(self, name) != neutral:
                raise APIError(
                    400, f"'{name}' applies only with 'use_beam_search': true", param=name
                )

    def beam_search_params(self, max_tokens: int) -> tuple[SamplingParams, BeamSearchParams]:
        """use_beam_search: the search's params, and SamplingParams that only describe
        the request (n, max_tokens) to the input processor. A field the search cannot
        honour is a 400 naming it (vLLM ignores them, which would answer differently
        from what was asked). The model's generation defaults do not apply: the search
        takes no sampling value."""
        if self.best_of not in (None, 1):
            raise APIError(400, "'best_of' greater than 1 is not supported", param="best_of")
        neutral: dict[str, Any] = {  # (0 == 0.0: an int stands for its float too)
            "temperature": (None, 0),
            "top_p": (None, 1),
            "top_k": (None, -1, 0),
            "min_p": (None, 0),
            "presence_penalty": (None, 0),
            "frequency_penalty": (None, 0),
            "repetition_penalty": (None, 1),
            "min_tokens": (0,),
            "logit_bias": (None, {}),
            "stop": (None, [], ""),
        }
        for name, values in neutral.items():
            if getattr(self, name) not in values:
                raise APIError(
                    400,
                    f"'{name}' cannot be used with beam search, which scores the model's "
                    "own log-probabilities and draws nothing",
                    param=name,
                )
        if self.logprobs_params():
            raise APIError(400, "'logprobs' are not returned with beam search", param="logprobs")
        if self.structured_output() is not None or self.json_schema() is not None:
            param = self.constraint_param()
            raise APIError(400, f"'{param}' cannot be used with beam search", param=param)
        search = BeamSearchParams(
            beam_width=self.n,
            max_tokens=max_tokens,
            length_penalty=self.length_penalty,
            early_stopping=self.early_stopping,
            ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens,
        )
        kind = RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY
        described = SamplingParams(
            n=self.n, max_tokens=max_tokens, stop_token_ids=list(search.stop_token_ids),
            temperature=0.0, output_kind=kind,
        )  # fmt: skip
        return described, search

    def answer_id(self, engine_id: str, prefix: str) -> str:
        """The answer's id: the engine request's, or made of the body's request_id.
        Only the answer takes the caller's id: the engine's stay unique, so an id
        sent again (a retry) is a new request, as in vLLM."""
        return f"{prefix}-{self.request_id}" if self.request_id else engine_id

    def truncated(self, prompt: PromptTokens, processor: InputProcessor) -> PromptTokens:
        """The prompt as truncate_prompt_tokens cuts it."""
        if self.truncate_prompt_tokens is None:
            return prompt
        return processor.truncate(prompt, self.truncate_prompt_tokens)

    def constraint_param(self) -> str:
        """The field the output's constraint came in (errors compiling it name it)."""
        constraint = self.structured_output()
        return constraint[0] if constraint is not None else "response_format"

    def logprobs_params(self) -> dict[str, int]:
        """SamplingParams' logprobs / prompt_logprobs, from each route's own fields."""
        return {}

    def sampling_params(
        self, max_tokens: int, defaults: Mapping[str, Any] | None = None
    ) -> SamplingParams:
        """The body's SamplingParams (which check their own ranges); what needs the
        model (token ids, the schema) the engine's input processor checks. ``defaults``
        (the model's generation config) fill the sampling fields the body leaves out."""
        self.unsupported()
        values: dict[str, Any] = dict(defaults or {})
        values |= {
            "n": self.n,
            "max_tokens": max_tokens,
            "ignore_eos": self.ignore_eos,
            "include_stop_str_in_output": self.include_stop_str_in_output,
            "min_tokens": self.min_tokens,
            "skip_special_tokens": self.skip_special_tokens,
            "spaces_between_special_tokens": self.spaces_between_special_tokens,
        }
        names = (
            "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
            "presence_penalty", "frequency_penalty", "repetition_penalty", "cache_salt",
            "allowed_token_ids", "bad_words",
        )  # fmt: skip
        for name in names:
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        if self.logit_bias:
            values["logit_bias"] = _token_bias(self.logit_bias)
        values.update(self.logprobs_params())
        if self.prompt_logprobs is not None:
            if values.get("prompt_logprobs", self.prompt_logprobs) != self.prompt_logprobs:
                raise APIError(
                    400,
                    "prompt_logprobs must equal logprobs when echo returns the prompt's "
                    "logprobs too",
                    param="prompt_logprobs",
                )
            values["prompt_logprobs"] = self.prompt_logprobs
        values["json_schema"] = self.json_schema()
        constraint = self.structured_output()
        if constraint is not None:
            values["structured_outputs"] = constraint[1]
        # A stream sends each step's part; an answer sent whole needs only the end.
        values["output_kind"] = (
            RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY
        )
        return SamplingParams(**values)


def _token_bias(logit_bias: dict[str, float]) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys, so as strings."""
    bias = {}
    for key, value in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            shown = key if len(key) <= 32 else key[:32] + "..."  # it may be megabytes long
            raise APIError(
                400, f"logit_bias: key {shown!r} is not a token id", param="logit_bias"
            ) from None
        bias[token_id] = value
    return bias
