"""engine/tokenizer/tokenizer.py: the Tokenizer wrapper: encode/decode round trips, chat
templates, eos ids, on the byte-fallback tokenizer and on SmolLM2's."""

from __future__ import annotations

from pathlib import Path

import pytest
from hetero_infer.engine.tokenizer import Tokenizer
from hypothesis import given
from tokenizers.processors import TemplateProcessing
from transformers import AutoTokenizer

from tests.engine.tokenizer.common import (
    MIXED_TEXT,
    PROPERTY_SETTINGS,
    SMOLLM2_VOCAB_SIZE,
    TEXT,
    byte_tokens,
)
from tests.helpers import (
    BOS_TOKEN_ID,
    BYTE_FALLBACK_VOCAB_SIZE,
    BYTE_TOKEN_IDS,
    EOS_TOKEN_ID,
    FIRST_BYTE_TOKEN_ID,
    UNK_TOKEN_ID,
    make_byte_fallback_tokenizer,
)


def test_byte_fallback_tokenizer_layout(bf_tok: Tokenizer) -> None:
    hf = bf_tok.hf_tokenizer
    assert bf_tok.vocab_size == BYTE_FALLBACK_VOCAB_SIZE < 512
    assert (hf.unk_token_id, hf.bos_token_id, hf.eos_token_id) == (
        UNK_TOKEN_ID,
        BOS_TOKEN_ID,
        EOS_TOKEN_ID,
    )
    assert bf_tok.byte_token_ids == frozenset(BYTE_TOKEN_IDS)
    assert hf.convert_ids_to_tokens([FIRST_BYTE_TOKEN_ID, FIRST_BYTE_TOKEN_ID + 255]) == [
        "<0x00>",
        "<0xFF>",
    ]
    assert bf_tok.special_token_ids == {UNK_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID}
    # ASCII uses real pieces; everything else falls back to bytes.
    assert hf.convert_ids_to_tokens(bf_tok.encode("Hello world", add_special_tokens=False)) == [
        "▁Hello",
        "▁world",
    ]
    assert bf_tok.encode("é", add_special_tokens=False)[1:] == byte_tokens("é".encode())
    assert bf_tok.encode("hi")[0] == BOS_TOKEN_ID


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Hello world",
        "naïve café",
        "你好，世界",
        "😀 ok 👍🏽",
        " leading",
        "a\nb\tc  ",
        MIXED_TEXT,
    ],
)
def test_byte_fallback_round_trip(bf_tok: Tokenizer, text: str) -> None:
    assert bf_tok.decode(bf_tok.encode(text)) == text
    assert bf_tok.decode(bf_tok.encode(text, add_special_tokens=False)) == text


@PROPERTY_SETTINGS
@given(text=TEXT)
def test_byte_fallback_round_trip_property(bf_tok: Tokenizer, text: str) -> None:
    assert bf_tok.decode(bf_tok.encode(text)) == text


def test_byte_fallback_save_and_reload(bf_tok: Tokenizer, tmp_path: Path) -> None:
    bf_tok.hf_tokenizer.save_pretrained(tmp_path)
    reloaded = Tokenizer(AutoTokenizer.from_pretrained(tmp_path))
    messages = [{"role": "user", "content": "hi 😀"}]
    assert reloaded.encode(MIXED_TEXT) == bf_tok.encode(MIXED_TEXT)
    assert reloaded.decode(bf_tok.encode(MIXED_TEXT)) == MIXED_TEXT
    assert reloaded.apply_chat_template(messages) == bf_tok.apply_chat_template(messages)
    assert reloaded.eos_token_ids == {EOS_TOKEN_ID}
    assert reloaded.byte_token_ids == bf_tok.byte_token_ids


# ----------------------------------------------------------------- wrapper: chat, eos


def test_chat_template_byte_fallback(bf_tok: Tokenizer) -> None:
    messages = [{"role": "user", "content": "hi é"}, {"role": "assistant", "content": "ok"}]
    ids = bf_tok.apply_chat_template(messages)
    rendered = "<s>user: hi é\nassistant: ok\nassistant:"
    assert ids == bf_tok.encode(rendered, add_special_tokens=False)
    assert ids[0] == BOS_TOKEN_ID and ids.count(BOS_TOKEN_ID) == 1
    without_prompt = bf_tok.apply_chat_template(messages, add_generation_prompt=False)
    assert bf_tok.decode(without_prompt) == "user: hi é\nassistant: ok\n"


@pytest.mark.parametrize("adds_eos", [False, True])
def test_chat_template_with_the_tokenizers_special_tokens(adds_eos: bool) -> None:
    """vLLM's add_special_tokens on a chat: the template's ids between the special
    tokens the tokenizer adds around a text, as encoding the rendered text with them
    gives (a second BOS here, the template writing one; and an EOS after, for a
    tokenizer set to add one)."""
    hf = make_byte_fallback_tokenizer()
    if adds_eos:
        hf.backend_tokenizer.post_processor = TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", BOS_TOKEN_ID), ("</s>", EOS_TOKEN_ID)]
        )
    tokenizer = Tokenizer(hf)
    messages = [{"role": "user", "content": "hi é"}]
    plain = tokenizer.apply_chat_template(messages)
    ids = tokenizer.apply_chat_template(messages, add_special_tokens=True)
    rendered = "<s>user: hi é\nassistant:"
    assert ids == tokenizer.encode(rendered, add_special_tokens=True)
    assert ids == [BOS_TOKEN_ID, *plain, *([EOS_TOKEN_ID] if adds_eos else [])]


def test_special_tokens_that_change_a_texts_own_are_refused(monkeypatch) -> None:
    tokenizer = Tokenizer(make_byte_fallback_tokenizer())
    # A post-processor that rewrites the text's tokens: nothing to put around the ids.
    monkeypatch.setattr(
        tokenizer,
        "encode",
        lambda text, add_special_tokens=True: [9] if add_special_tokens else [5],
    )
    with pytest.raises(ValueError, match="cannot be added") as error:
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_special_tokens=True)
    assert error.value.param == "add_special_tokens"


def test_chat_template_missing_is_a_value_error() -> None:
    hf = make_byte_fallback_tokenizer()
    hf.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        Tokenizer(hf).apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_rejecting_messages_is_a_value_error() -> None:
    hf = make_byte_fallback_tokenizer()
    hf.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(ValueError, match="roles must alternate"):
        Tokenizer(hf).apply_chat_template([{"role": "user", "content": "hi"}])


def test_chat_template_in_place_of_the_tokenizers_with_tools_and_variables() -> None:
    hf = make_byte_fallback_tokenizer()
    hf.chat_template = None  # the server's --chat-template stands in for a missing one
    template = (
        "{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
        "{% for m in messages %}{{ m.content }}{% endfor %}{% if shout %}!{% endif %}"
    )
    tools = [{"type": "function", "function": {"name": "f"}}]
    ids = Tokenizer(hf).apply_chat_template(
        [{"role": "user", "content": "hi"}],
        tools=tools,
        chat_template=template,
        template_kwargs={"shout": True},
    )
    assert Tokenizer(hf).decode(ids) == "[f]hi!"


@pytest.mark.parametrize("name", ["tools", "add_generation_prompt", "messages", "tokenize"])
def test_template_variables_may_not_shadow_the_calls_arguments(bf_tok: Tokenizer, name) -> None:
    with pytest.raises(ValueError, match=f"chat_template_kwargs: {name}") as error:
        bf_tok.apply_chat_template([{"role": "user", "content": "hi"}], template_kwargs={name: 1})
    assert error.value.param == "chat_template_kwargs"


def test_eos_token_ids() -> None:
    hf = make_byte_fallback_tokenizer()
    assert Tokenizer(hf).eos_token_ids == frozenset({EOS_TOKEN_ID})
    # e.g. a generation_config.json that lists more eos ids than the tokenizer marks
    assert Tokenizer(hf, extra_eos_token_ids=[EOS_TOKEN_ID, 300]).eos_token_ids == {2, 300}
    with pytest.raises(ValueError, match="eos token ids"):
        Tokenizer(hf, extra_eos_token_ids=[-1])
    hf.eos_token = None
    assert Tokenizer(hf).eos_token_ids == frozenset()
    assert Tokenizer(hf, extra_eos_token_ids=(7,)).eos_token_ids == {7}


def test_token_strings(bf_tok: Tokenizer) -> None:
    ids = bf_tok.encode("héllo", add_special_tokens=False)
    assert bf_tok.token_strings(ids) == bf_tok.hf_tokenizer.convert_ids_to_tokens(ids)
    assert "<0xC3>" in bf_tok.token_strings(ids)  # é's first byte, a byte-fallback token

    class Plugged:  # any encode/decode pair: each id's own text
        def encode(self, text: str) -> list[int]:
            return [ord(c) for c in text]

        def decode(self, ids: list[int]) -> str:
            return "".join(chr(i) for i in ids)

    assert Tokenizer(Plugged()).token_strings([104, 105]) == ["h", "i"]


@pytest.mark.slow
def test_smollm2_wrapper(smol_tok: Tokenizer) -> None:
    hf = smol_tok.hf_tokenizer
    assert smol_tok.vocab_size == SMOLLM2_VOCAB_SIZE
    assert smol_tok.eos_token_ids == {hf.convert_tokens_to_ids("<|im_end|>")}
    assert smol_tok.byte_token_ids == frozenset()  # byte-level BPE: no <0xNN> tokens
    assert smol_tok.decode(smol_tok.encode(MIXED_TEXT)) == MIXED_TEXT
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hi in 中文 😀"},
        {"role": "assistant", "content": "你好 👋"},
        {"role": "user", "content": "Again"},
    ]
    for add_generation_prompt in (True, False):
        expected = hf.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        if not isinstance(expected, list):  # transformers 5: a BatchEncoding
            expected = expected["input_ids"]
        got = smol_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
        assert got == expected
        # Its tokenizer adds no special tokens around a text: vLLM's flag changes nothing.
        flagged = smol_tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, add_special_tokens=True
        )
        assert flagged == got
        rendered = hf.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False
        )
        assert got == smol_tok.encode(rendered, add_special_tokens=False)


# A template that writes the tools it is given (as Qwen's and Hermes's do).
TOOLS_TEMPLATE = (
    "{% if tools %}{% for tool in tools %}{{ tool.function.name }}\n{% endfor %}{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
)


def test_which_templates_render_tools(smol_tok):
    """SmolLM2's template ignores tools; one that writes them is told apart, each
    template probed once."""
    assert not smol_tok.renders_tools()
    assert smol_tok.renders_tools(TOOLS_TEMPLATE)
    assert smol_tok.renders_tools(TOOLS_TEMPLATE)  # from what the first probe found
    assert not smol_tok.renders_tools("{% for m in messages %}{{ m.content }}{% endfor %}")


@pytest.mark.parametrize("name", ["smollm2", "byte_fallback"])
def test_decode_is_transformers_decode_without_clean_up(name, smol_tok, bf_tok) -> None:
    """Decoding goes straight to a fast tokenizer's Rust decoder: it must give what
    transformers' decode gives (special tokens kept or skipped, no space clean-up)."""
    import random

    tok = smol_tok if name == "smollm2" else bf_tok
    hf = tok.hf_tokenizer
    rng = random.Random(0)
    special = sorted(tok.special_token_ids)
    for _ in range(200):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 12))]
        ids.insert(rng.randrange(len(ids) + 1), rng.choice(special))
        for skip in (True, False):
            expected = hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert tok.decode(ids, skip_special_tokens=skip) == expected
