"""InputProcessor: the one path by which a prompt and its parameters are checked and
tokenized, for the engine's own add_request and for the server's routes alike.

Every check that needs the model (the vocabulary, the context length, the tokenizer, a
JSON schema's grammar) is here; what SamplingParams can check alone it checks itself.
A bad request raises ValidationError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_infer.engine.exceptions import ValidationError
from hetero_infer.engine.sampling_params import SamplingParams
from hetero_infer.engine.structured_output import StructuredOutput
from hetero_infer.engine.tokenizer import Tokenizer

Prompt = str | list[int]


@dataclass(frozen=True)
class EngineRequest:
    """A checked request, ready for the engine: its tokens, its params, and the grammar
    of its response_format (None without one), built once."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    grammar: Any = None


class InputProcessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        structured_output: StructuredOutput,
        vocab_size: int,
        max_model_len: int,
    ) -> None:
        self.tokenizer = tokenizer
        self.structured_output = structured_output
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len

    def process(self, request_id: str, prompt: Prompt, params: SamplingParams) -> EngineRequest:
        if not isinstance(params, SamplingParams):
            raise ValidationError(
                "sampling_params must be a SamplingParams", param="sampling_params"
            )
        text, token_ids = self.tokenize(prompt)
        grammar = self.check_params(params)
        return EngineRequest(request_id, text, token_ids, params, grammar)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(the prompt's text or None, its token ids), checked against the model."""
        if isinstance(prompt, str):
            if not prompt:
                raise ValidationError("prompt must not be empty", param="prompt")
            token_ids = self.tokenizer.encode(prompt)
            text: str | None = prompt
        elif isinstance(prompt, list | tuple) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            token_ids, text = list(prompt), None
        else:
            raise ValidationError("prompt must be a string or a list of token ids", param="prompt")
        self.check_prompt(token_ids)
        return text, token_ids

    def check_prompt(self, token_ids: list[int]) -> None:
        if not token_ids:
            raise ValidationError("prompt must not be empty", param="prompt")
        # (Encoded text too: a plugged-in tokenizer may not fit the model.)
        bad = [t for t in token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValidationError(
                f"prompt: token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})",
                param="prompt",
            )
        if len(token_ids) > self.max_model_len:
            raise ValidationError(
                f"prompt: {len(token_ids)} tokens is longer than max_model_len "
                f"({self.max_model_len})",
                param="prompt",
            )

    def check_params(self, params: SamplingParams) -> Any:
        """What SamplingParams cannot check alone: token ids and the JSON schema. Returns
        the schema's grammar (an llguidance matcher), or None without one."""
        params.check_vocab(self.vocab_size)
        if params.json_schema is None:
            return None
        return self.structured_output.matcher(params.json_schema)
