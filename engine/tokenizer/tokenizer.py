"""Tokenizer: the engine's wrapper over a Hugging Face tokenizer or a plugged-in one.

The engine only ever sees token ids; this is where text goes in (encode, chat template)
and where ids are decoded back (detokenizer.py streams that, one delta at a time).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import jinja2
from hetero_infer.engine.settings.exceptions import ConfigError, ValidationError
from hetero_infer.engine.tokenizer.byte_level_detokenizer import TokenBytes
from tokenizers.decoders import ByteLevel
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

# A tool's name no prompt holds: whether a template renders tools is whether it is
# in the prompt (Tokenizer.renders_tools).
TOOL_PROBE = "tool_probe_5e1c0a9d"


class Tokenizer:
    """The engine's view of a tokenizer: ids in, ids out, nothing else.

    Usually a Hugging Face tokenizer. Any other object with ``encode(text) -> ids`` and
    ``decode(ids) -> text`` plugs in too (the seed's ``TokenizerTrait``), with an
    ``eos_token_id`` (attribute or method) if it has one; chat templates and
    response_format need a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer: Any, extra_eos_token_ids: Iterable[int] = ()) -> None:
        self._hf = tokenizer if isinstance(tokenizer, PreTrainedTokenizerBase) else None
        if self._hf is None and not (
            callable(getattr(tokenizer, "encode", None))
            and callable(getattr(tokenizer, "decode", None))
        ):
            raise ConfigError("tokenizer must have encode(text) and decode(token_ids) methods")
        self._tokenizer = tokenizer
        eos_ids: set[int] = set()
        own_eos = _attribute(tokenizer, "eos_token_id")
        if own_eos is not None:
            eos_ids.add(int(own_eos))
        for token_id in extra_eos_token_ids:
            # A model's generation_config may list eos ids the tokenizer does not mark
            # (e.g. <|eot_id|> next to <|end_of_text|>): stopping needs all of them.
            if isinstance(token_id, bool) or not isinstance(token_id, int) or token_id < 0:
                raise ConfigError(f"eos token ids must be non-negative integers, got {token_id!r}")
            eos_ids.add(token_id)
        self._eos_token_ids = frozenset(eos_ids)
        hf = self._hf
        self._special_token_ids = _special_token_ids(hf) if hf is not None else frozenset()
        self._byte_token_ids = _byte_fallback_token_ids(hf) if hf is not None else frozenset()
        # chat template (None: the tokenizer's own) -> whether it renders tools
        self._renders_tools: dict[str | None, bool] = {}
        # A fast tokenizer's Rust decoder, called directly where transformers' decode
        # only wraps it (no clean-up, no override of its own): a stream decodes every
        # token twice, and the wrapper's checks cost ten times the decode.
        fast = isinstance(hf, PreTrainedTokenizerFast)
        plain = fast and type(hf)._decode is PreTrainedTokenizerFast._decode
        self._rust_decoder = hf.backend_tokenizer if plain else None

    @property
    def hf_tokenizer(self) -> PreTrainedTokenizerBase | None:
        """The Hugging Face tokenizer; None for a plugged-in one."""
        return self._hf

    @property
    def vocab_size(self) -> int | None:
        if self._hf is not None:
            # len() counts added tokens; the HF attribute `vocab_size` does not.
            return len(self._hf)
        return _attribute(self._tokenizer, "vocab_size")

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos_token_ids

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids that `decode(..., skip_special_tokens=True)` drops."""
        return self._special_token_ids

    @functools.cached_property
    def added_tokens(self) -> dict[int, str]:
        """The ids of the tokens added to the vocabulary (the special ones and others, as
        a chat's marks), with their text; none for a plugged-in tokenizer."""
        if self._hf is None:
            return {}
        return {i: token.content for i, token in self._hf.added_tokens_decoder.items()}

    @functools.cached_property
    def byte_level_token_bytes(self) -> TokenBytes | None:
        """Each id's bytes where the Rust decoder is byte-level BPE's alone (GPT-2's
        scheme), for ByteLevelDetokenizer; None for any other decoder."""
        if self._rust_decoder is None or not isinstance(self._rust_decoder.decoder, ByteLevel):
            return None
        return TokenBytes(self._rust_decoder)

    @property
    def byte_token_ids(self) -> frozenset[int]:
        """Ids of sentencepiece byte-fallback tokens `<0x00>`..`<0xFF>`; empty for others."""
        return self._byte_token_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._hf is None:
            return [int(i) for i in self._tokenizer.encode(text)]
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens))

    def with_special_tokens(self, ids: list[int]) -> list[int]:
        """``ids`` between the special tokens encode adds around a text (a BOS, say):
        found around the tokens of a probe text, so the ids themselves are kept as they
        are (a chat template's, whose own special tokens are in them already)."""
        probe = "x"
        bare = self.encode(probe, add_special_tokens=False)
        full = self.encode(probe, add_special_tokens=True)
        start = next((i for i in range(len(full)) if full[i : i + len(bare)] == bare), None)
        if start is None:  # the special tokens change the text's own: no telling them apart
            raise ValidationError(
                "this tokenizer's special tokens cannot be added around a chat template's prompt",
                param="add_special_tokens",
            )
        return full[:start] + ids + full[start + len(bare) :]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self._rust_decoder is not None:
            return self._rust_decoder.decode(ids, skip_special_tokens=skip_special_tokens)
        if self._hf is None:
            return self._tokenizer.decode(list(ids))
        # No clean-up of spaces before punctuation: it rewrites text across token
        # boundaries, which a stream that has already sent the space cannot follow.
        return self._hf.decode(
            ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False
        )

    def token_strings(self, ids: list[int]) -> list[str]:
        """Each id's string in the vocabulary (byte-level BPE's "Ġword", sentencepiece's
        "▁word"); a plugged-in tokenizer's decoded text of each id alone."""
        if self._hf is None:
            return [self._tokenizer.decode([token_id]) for token_id in ids]
        return list(self._hf.convert_ids_to_tokens(ids))

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        *,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """The messages through the chat template: the tokenizer's own, or
        ``chat_template`` (Jinja text) in its place. ``tools`` (OpenAI's function
        definitions) and ``template_kwargs`` (e.g. ``enable_thinking``) are the
        template's variables. ``continue_final_message``: the last message is left
        open, for the model to go on with (no generation prompt then).
        ``add_special_tokens``: the tokenizer's own around them too, as vLLM's field
        of that name adds them, on top of the template's."""
        if not (chat_template or getattr(self._hf, "chat_template", None)):
            raise ValidationError(
                "this tokenizer has no chat template; send a plain prompt "
                "(/v1/completions) or use a model whose tokenizer defines one",
                param="messages",
            )
        if self._hf is None:  # a plugged-in tokenizer given a template by the server
            raise ValidationError("chat templates need a Hugging Face tokenizer", param="messages")
        template_kwargs = template_kwargs or {}
        taken = set(template_kwargs) & _own_parameters(type(self._hf).apply_chat_template)
        if taken:
            raise ValidationError(
                f"chat_template_kwargs: {', '.join(sorted(taken))} cannot be set this way",
                param="chat_template_kwargs",
            )
        try:
            out = self._hf.apply_chat_template(
                messages,
                tools=tools or None,
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=True,
                return_dict=True,
                **template_kwargs,
            )
        except jinja2.TemplateError as e:
            # Templates reject bad conversations (roles out of order, ...) this way:
            # that is the caller's input, not our bug.
            raise ValidationError(
                f"chat template rejected the messages: {e}", param="messages"
            ) from e
        # transformers 5 returns a BatchEncoding here; older versions a plain list.
        ids = [int(i) for i in (out["input_ids"] if isinstance(out, Mapping) else out)]
        return self.with_special_tokens(ids) if add_special_tokens else ids

    def renders_tools(self, chat_template: str | None = None) -> bool:
        """Whether the chat template (``chat_template``, or the tokenizer's own) writes
        the tools it is given into the prompt. Many do not (SmolLM2's): the prompt is
        then the same with tools or without. Found by rendering a tool of a name no
        prompt holds, once per template."""
        if chat_template not in self._renders_tools:
            self._renders_tools[chat_template] = self._probe_tools(chat_template)
        return self._renders_tools[chat_template]

    def _probe_tools(self, chat_template: str | None) -> bool:
        if self._hf is None:  # no template of its own to probe
            return True
        probe = {"type": "function", "function": {"name": TOOL_PROBE, "parameters": {}}}
        try:
            text = self._hf.apply_chat_template(
                [{"role": "user", "content": "Hello"}],
                tools=[probe],
                chat_template=chat_template,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception:  # the template refuses the probe: a real request will say why
            return True
        return TOOL_PROBE in text


@functools.cache
def _own_parameters(function: Any) -> frozenset[str]:
    """The named parameters of ``function`` (a tokenizer class's apply_chat_template),
    which template variables must not shadow; read once per class, as reading a
    signature costs ~0.2 ms."""
    return frozenset(
        name
        for name, p in inspect.signature(function).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"
    ) | {"messages"}


def _attribute(tokenizer: Any, name: str) -> Any:
    """A plugged-in tokenizer's value: an attribute, or a method as the seed's trait has."""
    value = getattr(tokenizer, name, None)
    return value() if callable(value) else value


def _special_token_ids(hf_tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    candidates = set(hf_tokenizer.all_special_ids)
    added = getattr(hf_tokenizer, "added_tokens_decoder", {})
    candidates.update(i for i, token in added.items() if getattr(token, "special", False))
    # The detokenizer leaves these ids out of its window, so the set must be exactly what
    # decoding skips: an eos that is an ordinary vocab entry, say, is kept and shown.
    return frozenset(
        i
        for i in candidates
        if hf_tokenizer.decode([i], skip_special_tokens=True, clean_up_tokenization_spaces=False)
        == ""
    )


def _byte_fallback_token_ids(hf_tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    # 256 lookups instead of scanning a 150k-entry vocab; a missing token maps to unk.
    names = [f"<0x{b:02X}>" for b in range(256)]
    ids = hf_tokenizer.convert_tokens_to_ids(names)
    unk = hf_tokenizer.unk_token_id
    return frozenset(i for i in ids if i is not None and i != unk)
