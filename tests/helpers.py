"""Shared test fixtures that need no network: a tiny in-memory tokenizer.

`make_byte_fallback_tokenizer()` is built like Llama-2's sentencepiece tokenizer as
transformers converts it to `tokenizer.json`: a BPE model with `byte_fallback=True`, a
normalizer that prepends "▁" and turns spaces into "▁", and the decoder
Replace("▁", " ") -> ByteFallback -> Fuse -> Strip(one leading space). ASCII text uses
real pieces; anything else (é, 中, emoji, newline, tab) falls back to `<0xNN>` byte tokens.
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models, normalizers, processors
from transformers import PreTrainedTokenizerFast

UNK_TOKEN, BOS_TOKEN, EOS_TOKEN = "<unk>", "<s>", "</s>"
UNK_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID = 0, 1, 2

# <0x00>..<0xFF> follow the three special tokens, as in Llama-2's vocab.
FIRST_BYTE_TOKEN_ID = 3
BYTE_TOKEN_IDS = range(FIRST_BYTE_TOKEN_ID, FIRST_BYTE_TOKEN_ID + 256)

# Every printable ASCII character except space (which the normalizer makes "▁"). "\n" and
# "\t" are left out on purpose: like Llama-2, they fall back to bytes.
_CHARS = ["▁", *(c for c in string.printable if c.isprintable() and c != " ")]

# A few common pieces, so ASCII text is not all single characters.
_MERGES = [
    ("▁", "t"),
    ("h", "e"),
    ("▁t", "he"),
    ("i", "n"),
    ("e", "r"),
    ("o", "n"),
    ("a", "n"),
    ("r", "e"),
    ("▁", "a"),
    ("▁", "i"),
    ("▁", "w"),
    ("e", "d"),
    ("in", "g"),
    ("▁", "s"),
    ("o", "u"),
    ("▁", "H"),
    ("l", "l"),
    ("ll", "o"),
    ("▁H", "e"),
    ("▁He", "llo"),
    ("▁w", "o"),
    ("r", "l"),
    ("rl", "d"),
    ("▁wo", "rld"),
    ("▁a", "n"),
    ("▁an", "d"),
    ("i", "s"),
    ("▁", "is"),
    ("a", "t"),
    ("▁", "c"),
]

# 3 special + 256 byte + 95 character tokens + 30 merged pieces.
BYTE_FALLBACK_VOCAB_SIZE = 384

# It renders the tools, as real templates do, but in a line that does not grow with
# them: the tiny models' contexts are 512 tokens, and the constraint tests send
# thousands of tools for the grammar. (A template that renders none gets the generic
# tool prompt, server/serving/tool_prompt.py, tested on SmolLM2's.)
CHAT_TEMPLATE = (
    "<s>{% if tools %}tools: {{ tools[0]['function']['name'] }} and {{ tools | length - 1 }}"
    " more\n{% endif %}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def make_byte_fallback_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-2-style byte-fallback tokenizer with bos <s> (1), eos </s> (2), unk (0)."""
    vocab: dict[str, int] = {}
    for token in [UNK_TOKEN, BOS_TOKEN, EOS_TOKEN, *(f"<0x{b:02X}>" for b in range(256))]:
        vocab[token] = len(vocab)
    for token in _CHARS:
        vocab[token] = len(vocab)
    for left, right in _MERGES:
        vocab[left + right] = len(vocab)
    assert len(vocab) == BYTE_FALLBACK_VOCAB_SIZE, len(vocab)

    backend = Tokenizer(
        models.BPE(
            vocab=vocab, merges=_MERGES, unk_token=UNK_TOKEN, byte_fallback=True, fuse_unk=True
        )
    )
    # Llama-2's converted tokenizer.json uses these normalizers rather than a Metaspace
    # pre-tokenizer: "▁" is prepended even when the text starts with a space, so
    # " x" survives a round trip (Metaspace's prepend skips text already starting so).
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(content=" ", left=1, right=0),
        ]
    )
    backend.add_special_tokens([UNK_TOKEN, BOS_TOKEN, EOS_TOKEN])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, BOS_TOKEN_ID)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )
