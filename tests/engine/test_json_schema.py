"""response_format by constrained decoding (llguidance): the output is JSON that the
schema validates. On the tiny random model with schemas whose every path is short,
and (slow) on SmolLM2 with 20 schemas: nested objects, arrays, enums, numbers,
required fields.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import jsonschema
import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.params.guided_decoding import StructuredOutputsParams
from hetero_infer.engine.params.structured_output import (
    StructuredOutput,
    _first_line,
    bitmask_words,
)

from tests.helpers import make_byte_fallback_tokenizer
from tests.tiny_models import save_tiny_model

SMALL = {
    "type": "object",
    "properties": {
        "colour": {"enum": ["red", "green", "blue"]},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["colour", "ok", "tags", "size"],
    "additionalProperties": False,
}


def test_mask_allows_only_what_the_grammar_does():
    tokenizer = make_byte_fallback_tokenizer()
    vocab = len(tokenizer)
    matcher = StructuredOutput(tokenizer, vocab, [2]).matcher({"enum": ["yes", "no"]})
    # Every allowed token starts the text '"yes"' or '"no"'.
    texts = {tokenizer.decode([i]) for i in allowed_tokens(matcher, vocab)}
    assert texts and all('"yes"'.startswith(t) or '"no"'.startswith(t) for t in texts)


def allowed_tokens(matcher, vocab: int) -> list[int]:
    """The tokens the matcher's next mask allows."""
    words = bitmask_words(matcher.compute_bitmask(), vocab)
    allowed = ((words[:, None] >> torch.arange(32)) & 1).flatten()[:vocab]
    return allowed.nonzero().flatten().tolist()


def test_a_finished_output_allows_the_engines_eos_tokens():
    """The grammar ends on the engine's EOS ids (its generation config's), not on the
    tokenizer's own EOS."""
    tokenizer = make_byte_fallback_tokenizer()
    assert tokenizer.eos_token_id == 2
    structured = StructuredOutput(tokenizer, len(tokenizer), [5, 7])
    matcher = structured.guided_matcher(StructuredOutputsParams(grammar='start: "ab"'), "g")
    for token in tokenizer.convert_tokens_to_ids(["a", "b"]):
        assert matcher.consume_token(token)
    assert allowed_tokens(matcher, len(tokenizer)) == [5, 7]


def test_a_slow_tokenizer_is_refused():
    """llguidance reads a fast (tokenizers) tokenizer; anything else is a clear error."""
    slow = SimpleNamespace(is_fast=False)
    with pytest.raises(ValueError, match="needs a fast"):
        StructuredOutput(slow, 10, [2]).matcher({"type": "integer"})
    with pytest.raises(ValueError, match="needs a fast"):
        StructuredOutput(SimpleNamespace(), 10, [2]).matcher({"type": "integer"})


def test_a_parser_error_keeps_its_first_line_and_its_first_error_line():
    message = "invalid regex: parse error:\n  (abc\n  ^\nerror: unclosed group\nerror: more"
    assert _first_line(message) == "invalid regex: parse error: error: unclosed group"
    assert _first_line("bad grammar\nerror: at 3") == "bad grammar error: at 3"
    assert _first_line("no detail\nparser state") == "no detail"


def test_bad_schema_is_a_value_error():
    tokenizer = make_byte_fallback_tokenizer()
    with pytest.raises(ValueError, match="response_format"):
        StructuredOutput(tokenizer, len(tokenizer), [2]).matcher({"type": "bogus"})


def test_tiny_model_output_validates(tmp_path):
    engine = LLMEngine(
        EngineConfig(
            model=str(save_tiny_model("llama", tmp_path)), max_model_len=256, max_num_blocks=64
        )
    )
    params = SamplingParams(max_tokens=100, temperature=1.0, seed=0, json_schema=SMALL, n=3)
    for out in engine.generate(["hello", "the cat"], params, use_tqdm=False):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SMALL)


SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}},
     "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"]},
    {"type": "object", "properties": {"price": {"type": "number"}}, "required": ["price"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
     "required": ["colour"]},
    {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 5},
    {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30}},
     "required": ["city", "country"], "additionalProperties": False},
    {"type": "object", "properties": {"person": {"type": "object", "properties": {
        "first": {"type": "string", "maxLength": 20}, "last": {"type": "string", "maxLength": 20}},
        "required": ["first", "last"], "additionalProperties": False}},
     "required": ["person"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "qty": {"type": "integer"}},
        "required": ["id", "qty"], "additionalProperties": False}}},
     "required": ["items"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"enum": ["open", "closed"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 1000}},
     "required": ["status", "count"], "additionalProperties": False},
    {"type": "object", "properties": {"lat": {"type": "number", "minimum": -90, "maximum": 90},
        "lon": {"type": "number", "minimum": -180, "maximum": 180}},
     "required": ["lat", "lon"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 4,
        "items": {"type": "string", "maxLength": 12}}}, "required": ["tags"]},
    {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
     "required": ["answer", "confidence"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {
        "type": "object", "properties": {"c": {"type": "integer"}}, "required": ["c"],
        "additionalProperties": False}}, "required": ["b"], "additionalProperties": False}},
     "required": ["a"], "additionalProperties": False},
    {"type": "object", "properties": {"day": {"enum": ["mon", "tue", "wed"]},
        "hours": {"type": "array", "maxItems": 3, "items": {"type": "integer", "minimum": 0,
        "maximum": 23}}}, "required": ["day", "hours"], "additionalProperties": False},
    {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        "rating": {"enum": [1, 2, 3, 4, 5]}},
     "required": ["title", "year", "rating"], "additionalProperties": False},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}, "admin": {"type": "boolean"},
        "roles": {"type": "array", "maxItems": 3, "items": {"enum": ["read", "write"]}}},
        "required": ["name", "admin", "roles"], "additionalProperties": False}},
     "required": ["user"], "additionalProperties": False},
    {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"},
        "label": {"type": ["string", "null"], "maxLength": 10}},
     "required": ["x", "y", "label"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "maxItems": 2, "items": {"type": "number"}}}},
     "required": ["matrix"], "additionalProperties": False},
]  # fmt: skip


@pytest.mark.slow
def test_smollm2_twenty_schemas_validate():
    engine = LLMEngine(EngineConfig(dtype="float32", max_model_len=1024))
    assert len(SCHEMAS) == 20
    prompts = [
        engine.tokenizer.apply_chat_template(
            [
                {
                    "role": "user",
                    "content": "Answer in JSON matching this schema: " + json.dumps(schema),
                }
            ]
        )
        for schema in SCHEMAS
    ]
    params = [SamplingParams(max_tokens=200, temperature=0, json_schema=s) for s in SCHEMAS]
    started = time.monotonic()
    outs = engine.generate(prompts, params, use_tqdm=False)
    elapsed = time.monotonic() - started
    for schema, out in zip(SCHEMAS, outs, strict=True):
        assert out.finish_reason == "stop", (schema, out.text)
        jsonschema.validate(json.loads(out.text), schema)
    print(f"20 schemas: {sum(len(o.token_ids) for o in outs)} tokens in {elapsed:.1f} s")
