"""vLLM's structured outputs on /v1/chat/completions and /v1/completions, against the
real engine on the tiny random model: structured_outputs (each constraint), the older
guided_* fields and response_format's forms. Each answer, over 20 seeds at
temperature 1, satisfies its constraint (a structural tag's trigger forced by a
logit_bias, so that each answer holds tagged JSON to check); malformed constraints, two
constraints at once, or another backend are a 400 naming the field, answered fast."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest

from tests.server.conftest import MODEL_NAME

SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"}},
    "required": ["n", "ok"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", "a.b*c", "naïve (x|y)"]
REGEX = r"[a-z]{1,6}@[a-z]{2,4}\.(com|org)"
LARK = 'start: item ("," item){0,3}\nitem: /[0-9]{1,3}/ | "x"'
GBNF = 'root ::= "<" [a-c]+ ">"'
# The trigger is the begin's first character, one token: a logit_bias on it makes the
# tiny model write it wherever the text is free (static biases on the tokens of a longer
# trigger cannot put them in order: the random model wrote it in some answers only).
TRIGGER, BEGIN, END = "<", "<f=a>", "</f>"
TAG = {"structures": [{"begin": BEGIN, "schema": SCHEMA, "end": END}], "triggers": [TRIGGER]}
TAGGED = re.compile(f"{re.escape(BEGIN)}(.*?){re.escape(END)}", re.S)


def _json(text: str) -> bool:
    jsonschema.validate(json.loads(text), SCHEMA)
    return True


def _tagged(text: str) -> bool:
    """The trigger only ever opens a tagged part (the last may be cut short by
    max_tokens); at least one is whole, and each whole one holds JSON the schema
    validates."""
    whole, at = 0, text.find(TRIGGER)
    while at >= 0:
        tagged = TAGGED.match(text, at)
        if tagged is None:
            rest = text[at:]
            assert BEGIN.startswith(rest) or (rest.startswith(BEGIN) and END not in rest), rest
            break
        _json(tagged[1])
        whole += 1
        at = text.find(TRIGGER, tagged.end())
    assert whole, f"no tagged part in {text!r}"
    return True


# (body fields, check of the output text)
FORMS = {
    "structured_outputs.choice": (
        {"structured_outputs": {"choice": CHOICES}},
        CHOICES.__contains__,
    ),
    "structured_outputs.regex": (
        {"structured_outputs": {"regex": REGEX}},
        lambda t: re.fullmatch(REGEX, t),
    ),
    "structured_outputs.json": ({"structured_outputs": {"json": SCHEMA}}, _json),
    "structured_outputs.json_text": ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, _json),
    "structured_outputs.grammar": (
        {"structured_outputs": {"grammar": LARK}},
        lambda t: re.fullmatch(r"([0-9]{1,3}|x)(,([0-9]{1,3}|x)){0,3}", t),
    ),
    "structured_outputs.gbnf": (
        {"structured_outputs": {"grammar": GBNF}},
        lambda t: re.fullmatch("<[a-c]+>", t),
    ),
    "structured_outputs.json_object": (
        {"structured_outputs": {"json_object": True}},
        lambda t: isinstance(json.loads(t), dict),
    ),
    "structured_outputs.structural_tag": ({"structured_outputs": {"structural_tag": TAG}}, _tagged),
    "guided_choice": ({"guided_choice": CHOICES}, CHOICES.__contains__),
    "guided_regex": (
        {"guided_regex": REGEX, "guided_decoding_backend": "guidance"},
        lambda t: re.fullmatch(REGEX, t),
    ),
    "guided_json": ({"guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]?"}, _json),
    "guided_grammar": ({"guided_grammar": GBNF}, lambda t: re.fullmatch("<[a-c]+>", t)),
    "response_format.json_schema": (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": SCHEMA},
            }
        },
        _json,
    ),
    "response_format.structural_tag": (
        {"response_format": {"type": "structural_tag", **TAG}},
        _tagged,
    ),
}
# Forms whose grammar always ends (the structural tag and json_object may not: tagged
# parts one after another, or an object that grows, until max_tokens).
ENDING = {name for name in FORMS if "structural_tag" not in name and "json_object" not in name}
SEEDS = 20


def _post(http: httpx.Client, route: str, fields: dict, **extra) -> httpx.Response:
    body = {"model": MODEL_NAME, "max_tokens": 60, **fields, **extra}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Answer."}]
        return http.post("/v1/chat/completions", json=body)
    body["prompt"] = "Answer:"
    return http.post("/v1/completions", json=body)


def _texts(answer: dict) -> list[tuple[str, str]]:
    return [
        (c["message"]["content"] if "message" in c else c["text"], c["finish_reason"])
        for c in answer["choices"]
    ]


@pytest.fixture(scope="module")
def http(server) -> httpx.Client:
    with server.client(timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def trigger_bias(server) -> dict[str, float]:
    """logit_bias for the trigger's token, as the server's tokenizer writes it inside a
    text (a text's start takes the tokenizer's leading "▁" too)."""
    encode = server.engine.tokenizer.encode
    before = encode("x", add_special_tokens=False)
    ids = encode("x" + TRIGGER, add_special_tokens=False)
    assert ids[: len(before)] == before and len(ids) == len(before) + 1, ids
    return {str(ids[-1]): 100}


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize("form", FORMS)
def test_output_satisfies_the_constraint(http, trigger_bias, route: str, form: str):
    fields, check = FORMS[form]
    if "structural_tag" in form:
        fields = {**fields, "logit_bias": trigger_bias}
    # All seeds at once: the engine batches them.
    with ThreadPoolExecutor(SEEDS) as pool:
        responses = list(
            pool.map(
                lambda seed: _post(http, route, fields, temperature=1.0, seed=seed), range(SEEDS)
            )
        )
    for seed, response in enumerate(responses):
        assert response.status_code == 200, response.text
        for text, finish in _texts(response.json()):
            if form in ENDING:
                assert finish == "stop", (form, text)
            if finish == "stop" or "json_object" not in form:
                assert check(text), (form, seed, text)


def test_stream_and_n_follow_the_constraint(http):
    body = {
        "model": MODEL_NAME,
        "prompt": "Answer:",
        "max_tokens": 60,
        "temperature": 1.0,
        "seed": 3,
        "n": 3,
        "guided_choice": CHOICES,
    }
    texts = {i: "" for i in range(3)}
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    texts[choice["index"]] += choice["text"]
    assert all(text in CHOICES for text in texts.values()), texts


BAD = [
    ({"structured_outputs": {"regex": "(abc"}}, "structured_outputs.regex"),
    ({"guided_regex": "[z-a]"}, "guided_regex"),
    ({"structured_outputs": {"grammar": "start: nothing_here"}}, "structured_outputs.grammar"),
    ({"guided_grammar": 'root ::= "a" ('}, "guided_grammar"),
    ({"guided_json": {"type": "bogus"}}, "guided_json"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"pattern": "a"}}, "structured_outputs.pattern"),
    (
        {"structured_outputs": {"structural_tag": {"structures": []}}},
        "structured_outputs.structural_tag",
    ),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a"}, "guided_json": SCHEMA}, "guided_json"),
    ({"guided_regex": "a", "guided_decoding_backend": "xgrammar"}, "guided_decoding_backend"),
    ({"guided_regex": "a", "guided_whitespace_pattern": " "}, "guided_whitespace_pattern"),
    ({"guided_regex": "a" * 200_000}, "guided_regex"),
]


@pytest.mark.parametrize("route", ["chat", "completions"])
@pytest.mark.parametrize(("fields", "param"), BAD, ids=[p for _, p in BAD])
def test_bad_constraints_are_400_naming_the_field(http, route, fields, param):
    response = _post(http, route, fields)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert param.split(".")[0] in error["message"], error


def test_both_constraints_are_named(http):
    error = _post(http, "chat", {"guided_regex": "a", "guided_choice": ["a"]}).json()["error"]
    assert "'guided_regex'" in error["message"] and "'guided_choice'" in error["message"]


def test_tool_choice_and_a_constraint_are_refused(http):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    response = _post(http, "chat", {"guided_regex": "a", "tools": tools, "tool_choice": "required"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "guided_regex"


@pytest.mark.parametrize(
    "fields",
    [
        {"guided_regex": "(a+)+$"},
        {"guided_regex": "|".join(f"w{i}" for i in range(15_000))},
        {"guided_choice": [f"c{i}" for i in range(20_000)]},
        {
            "guided_grammar": "start: a0\n"
            + "\n".join(f"a{i}:a{i + 1}" for i in range(9000))
            + '\na9000:"z"'
        },
    ],
    ids=["catastrophic-regex", "huge-alternation", "huge-choice", "deep-rule-chain"],
)
def test_hard_constraints_answer_fast_and_the_server_lives(http, server, fields):
    start = time.monotonic()
    response = _post(http, "completions", fields, max_tokens=8)
    assert response.status_code in (200, 400), response.text
    assert time.monotonic() - start < 10.0
    again = _post(http, "completions", {"guided_choice": ["ok"]}, max_tokens=4)
    assert again.json()["choices"][0]["text"] == "ok"
    assert server.engine.memory_stats()["used_blocks"] == 0
