"""vLLM's structured outputs in the engine (engine/params/guided_decoding.py): each constraint
compiles to a matcher, bad ones are a ValueError naming the field, grammars that would
take long or overflow the stack are refused or compiled safely, and the tiny random
model's output (temperature 1, many seeds) satisfies each constraint."""

from __future__ import annotations

import contextlib
import json
import re
import time

import jsonschema
import pytest
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.params.guided_decoding import (
    MAX_GRAMMAR_CHARS,
    StructuredOutputsParams,
    _json_text,
    json_options,
)
from hetero_infer.engine.params.structured_output import StructuredOutput

from tests.helpers import make_byte_fallback_tokenizer
from tests.tiny_models import save_tiny_model

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
}
CLOSED_SCHEMA = {**SCHEMA, "additionalProperties": False}
CHOICES = ["yes", "no", "a.b*c", "naïve (x|y)"]  # regex metacharacters must stay literal
REGEX = r"[a-z]{1,6}@[a-z]{2,4}\.(com|org)"
LARK = 'start: item ("," item){0,3}\nitem: /[0-9]{1,3}/ | "x"'
LARK_TEXT = re.compile(r"([0-9]{1,3}|x)(,([0-9]{1,3}|x)){0,3}")
GBNF = 'root ::= "<" [a-c]+ ">"'


def tag(**fields) -> StructuredOutputsParams:
    """A structural tag with one good structure and trigger, unless ``fields`` say otherwise."""
    value = {
        "structures": [{"begin": "<f=a>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f="],
    }
    return StructuredOutputsParams(structural_tag=value | fields)


@pytest.fixture(scope="module")
def structured() -> StructuredOutput:
    tokenizer = make_byte_fallback_tokenizer()
    return StructuredOutput(tokenizer, len(tokenizer), [2])


@pytest.mark.parametrize(
    "spec",
    [
        StructuredOutputsParams(choice=CHOICES),
        StructuredOutputsParams(regex=REGEX),
        StructuredOutputsParams(grammar=LARK),
        StructuredOutputsParams(grammar=GBNF),
        StructuredOutputsParams(json=SCHEMA),
        StructuredOutputsParams(json=json.dumps(SCHEMA), disable_additional_properties=True),
        StructuredOutputsParams(json_object=True, whitespace_pattern="[ ]?"),
        StructuredOutputsParams(
            structural_tag={
                "structures": [{"begin": "<f=a>", "schema": SCHEMA, "end": "</f>"}],
                "triggers": ["<f="],
            }
        ),
    ],
    ids=lambda spec: spec.kind,
)
def test_every_constraint_compiles(structured: StructuredOutput, spec: StructuredOutputsParams):
    matcher = structured.guided_matcher(spec, "structured_outputs")
    assert not matcher.is_error()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (StructuredOutputsParams(regex="(abc"), "unclosed group"),
        (StructuredOutputsParams(grammar="start: missing_rule"), "unknown name"),
        (StructuredOutputsParams(json={"type": "bogus"}), "not usable"),
        (StructuredOutputsParams(json="{not json"), "not valid JSON"),
        (StructuredOutputsParams(structural_tag={"structures": []}), "triggers"),
        (StructuredOutputsParams(structural_tag={"triggers": ["<f="]}), "must be"),
        (tag(triggers=["<f=", ""]), "triggers must be"),
        (tag(triggers=["<f=", 1]), "triggers must be"),
        (tag(structures=[]), "structures must be"),
        (tag(structures="<f=a>"), "structures must be"),
        (tag(structures=[{"begin": "<f=a>"}]), "needs 'begin' and 'end'"),
        (tag(structures=[[]]), "needs 'begin' and 'end'"),
        (
            StructuredOutputsParams(
                structural_tag={"structures": [{"begin": "<g>", "end": ""}], "triggers": ["<f"]}
            ),
            "none of the triggers",
        ),
    ],
)
def test_bad_constraints_name_the_field(structured, spec, message):
    with pytest.raises(ValueError, match=message) as info:
        structured.guided_matcher(spec, "guided_x")
    assert info.value.param == "guided_x" and str(info.value).startswith("guided_x: ")


def test_params_check_their_shape():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match="non-empty list"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match="non-empty list"):
        StructuredOutputsParams(choice=["a", 1])
    with pytest.raises(ValueError, match="at most"):
        StructuredOutputsParams(grammar="x" * (MAX_GRAMMAR_CHARS + 1))
    StructuredOutputsParams(grammar="x" * MAX_GRAMMAR_CHARS)
    # Choices count a separator each: 2 * (half + 1) > the bound.
    half = MAX_GRAMMAR_CHARS // 2
    with pytest.raises(ValueError, match="at most"):
        StructuredOutputsParams(choice=["x" * half, "y" * half])
    assert StructuredOutputsParams(regex="a", json_object=False).kind == "regex"
    assert not StructuredOutputsParams(regex="a").disable_additional_properties
    with pytest.raises(ValueError, match="both constrain"):
        SamplingParams(json_schema=SCHEMA, structured_outputs=StructuredOutputsParams(regex="a"))


def test_hard_grammars_are_fast_or_refused(structured: StructuredOutput):
    """A catastrophic regex costs nothing (llguidance matches by derivatives); a huge
    alternation compiles or is refused within a second or so; chains of rules and of
    $refs deep enough to overflow an 8 MiB stack compile on the compile thread's."""
    cases = [
        StructuredOutputsParams(regex="(a+)+$"),
        StructuredOutputsParams(regex="|".join(f"w{i}" for i in range(15_000))),
        StructuredOutputsParams(choice=[f"c{i}" for i in range(20_000)]),
        StructuredOutputsParams(
            grammar="start: a0\n"
            + "\n".join(f"a{i}:a{i + 1}" for i in range(10_000))
            + '\na10000:"z"'
        ),
    ]
    for spec in cases:
        start = time.monotonic()
        with contextlib.suppress(ValueError):
            structured.guided_matcher(spec, "structured_outputs")
        assert time.monotonic() - start < 5.0, spec.kind
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}
    defs["d5000"] = {"type": "integer"}
    structured.matcher({"$ref": "#/$defs/d0", "$defs": defs})


def test_an_output_that_never_ends_is_refused_before_generation(structured: StructuredOutput):
    """Forced into a loop from its first token: refused when compiled, not mid-answer."""
    with pytest.raises(ValueError, match="past the first token"):
        structured.guided_matcher(StructuredOutputsParams(grammar='start: "a" start'), "g")
    with pytest.raises(ValueError, match="past the first token"):
        structured.matcher(
            {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
        )
    assert not structured.guided_matcher(
        StructuredOutputsParams(grammar='start: "ab"'), "g"
    ).is_error()


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> LLMEngine:
    model = save_tiny_model("llama", tmp_path_factory.mktemp("guided"))
    return LLMEngine(EngineConfig(model=str(model), max_model_len=256, max_num_blocks=256))


CHECKS = {
    "choice": (StructuredOutputsParams(choice=CHOICES), lambda text: text in CHOICES),
    "regex": (StructuredOutputsParams(regex=REGEX), lambda text: re.fullmatch(REGEX, text)),
    "grammar": (StructuredOutputsParams(grammar=LARK), lambda text: LARK_TEXT.fullmatch(text)),
    "gbnf": (StructuredOutputsParams(grammar=GBNF), lambda t: re.fullmatch("<[a-c]+>", t)),
    "json": (
        StructuredOutputsParams(json=SCHEMA, disable_additional_properties=True),
        lambda text: jsonschema.validate(json.loads(text), CLOSED_SCHEMA) is None,
    ),
}


@pytest.mark.parametrize("kind", CHECKS)
def test_tiny_model_output_satisfies_the_constraint(engine: LLMEngine, kind: str):
    spec, check = CHECKS[kind]
    params = [
        SamplingParams(max_tokens=60, temperature=1.0, seed=seed, structured_outputs=spec)
        for seed in range(20)
    ]
    outputs = engine.generate(["the cat"] * 20, params, use_tqdm=False)
    for out in outputs:
        assert out.finish_reason == "stop", (kind, out.text)
        assert check(out.text), (kind, out.text)


def test_a_json_text_nests_at_most_128_levels():
    assert _json_text("[" * 128 + "]" * 128, "bad")
    with pytest.raises(ValueError, match="more than 128"):
        _json_text("[" * 129 + "]" * 129, "bad")
    with pytest.raises(ValueError, match="more than 128"):
        _json_text('{"a": ' * 129 + "1" + "}" * 129, "bad")


def test_no_additional_properties_closes_only_objects_with_properties():
    schema = {
        "type": "object",
        "properties": {
            "open": {"type": "object"},
            "pattern": {"type": "object", "patternProperties": {"^x": {}}},
            "kept": {"type": "object", "properties": {}, "additionalProperties": True},
        },
    }
    spec = StructuredOutputsParams(json=schema, disable_additional_properties=True)
    closed = json_options(schema, spec)
    assert closed["additionalProperties"] is False
    inner = closed["properties"]
    assert "additionalProperties" not in inner["open"]
    assert inner["pattern"]["additionalProperties"] is False
    assert inner["kept"]["additionalProperties"] is True
    assert "additionalProperties" not in schema  # the caller's schema is left as it was
    assert "additionalProperties" not in json_options(schema, StructuredOutputsParams(json=schema))
