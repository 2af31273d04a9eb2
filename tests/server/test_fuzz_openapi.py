"""Schemathesis fuzzes the HTTP routes from the live server's own /openapi.json, against
the real engine on a tiny model: for each route, bodies (and path parameters) the
schema calls valid and ones that break it, drawn by Hypothesis from a fixed seed
(every run sends the same). The routes: OpenAI's, the Responses API, Anthropic's
Messages API and Ollama's native API.

Every answer: no 5xx; every error body in its route family's shape (OpenAI's on /v1/*,
Anthropic's on /v1/messages*, Ollama's on /api/*: route_shapes.py), a stream's in-band
errors too; a stream after its 200 reports no error and finishes as its family's
streams do (OpenAI's: every choice finished and [DONE]; the Responses API's:
response.completed or response.incomplete; Anthropic's: message_stop; Ollama's: a last
line with done: true); the status, content type and body as the route documents them.

Not checked: that every body the schema calls valid is accepted, as a schema cannot say
everything the server refuses (a prompt longer than the context, a model it does not
serve, a token id outside the vocabulary); nor that every body it calls invalid is
refused, as pydantic's lax mode takes 1 for true and "5" for 5 in the sampling fields
(token ids it no longer takes so: test_fuzz_regressions.py).
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import MODEL_NAME, LiveServer, make_engine, start_server
from tests.server.openai_shapes import parse_stream
from tests.server.route_shapes import (
    error_message,
    parse_anthropic_stream,
    parse_ndjson_stream,
    parse_responses_stream,
    route_family,
)

pytestmark = pytest.mark.slow

# (method, path) of every fuzzed operation.
FUZZED = [
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/{model}"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/v1/responses"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/api/chat"),
    ("POST", "/api/generate"),
    ("POST", "/api/embed"),
    ("POST", "/api/show"),
    ("GET", "/api/tags"),
    ("GET", "/api/ps"),
    ("GET", "/api/version"),
]
# GET routes with no input to vary: one case each, and no invalid one (the schema's
# own list is checked against this one).
WITHOUT_INPUTS = {
    ("GET", "/v1/models"),
    ("GET", "/api/tags"),
    ("GET", "/api/ps"),
    ("GET", "/api/version"),
}
# Routes whose only input is a string in the path: no value of it breaks the schema.
NOTHING_INVALID = WITHOUT_INPUTS | {
    ("GET", "/v1/models/{model}"),
    ("GET", "/v1/responses/{response_id}"),
    ("DELETE", "/v1/responses/{response_id}"),
}
HELLO = [{"role": "user", "content": "Hello"}]
# The routes that stream, and what their streamed runs fix in each valid body the
# fuzzer draws: a prompt the server takes (the schema cannot say what it refuses in
# one: a token id outside the vocabulary, a content block it does not know), and
# the fields to leave out for the same reason. Every other field is drawn.
STREAMED: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "/v1/completions": ({"prompt": "Hello"}, ()),
    "/v1/chat/completions": ({"messages": HELLO}, ()),
    "/v1/responses": ({"input": "Hello"}, ("previous_response_id",)),
    "/v1/messages": ({"messages": HELLO}, ()),
    "/api/chat": ({"messages": HELLO}, ()),
    "/api/generate": ({"prompt": "Hello"}, ("context", "images", "suffix", "template")),
}
STREAMED_MODE = "streamed"
# Valid inputs and invalid ones for each route that takes any; and for each route that
# streams, valid bodies with a prompt it takes, streamed.
RUNS: list[tuple[str, str, GenerationMode | str]] = [
    *(
        (method, path, mode)
        for method, path in FUZZED
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        if not ((method, path) in NOTHING_INVALID and mode == GenerationMode.NEGATIVE)
    ),
    *(("POST", path, STREAMED_MODE) for path in STREAMED),
]
SEED = 20261125
# Cases per route and mode (150 before the Responses, Anthropic and Ollama routes came;
# 100 took 100 s of a worker on an AVX2-only EPYC, 60 keeps the suite under 15 minutes).
MAX_EXAMPLES = 60
# The fuzzer's max_tokens and n run to the schema's bounds: the server's context keeps
# each request's work small (prompt + output <= 64 tokens), and a request without
# max_tokens gets 8 (the model's default, as a generation config would give it).
FUZZ_MAX_MODEL_LEN = 64
DEFAULT_MAX_TOKENS = 8
REQUEST_TIMEOUT = 60.0
# Fewer cases than this means routes went unfuzzed: a route without inputs gets one
# case, each other route at least MAX_EXAMPLES over its runs (each route is checked on
# its own too).
MIN_CASES = (len(FUZZED) - len(WITHOUT_INPUTS)) * MAX_EXAMPLES + len(WITHOUT_INPUTS)
# Streams (answered 200) each streaming route gets at least: a fifth of its streamed
# run, or its stream checks went untried.
MIN_STREAMS = MAX_EXAMPLES // 5


@dataclass
class Tally:
    """What the fuzzer sent and got, for the figures in docs/reliability.md."""

    statuses: Counter[int] = field(default_factory=Counter)
    streams: int = 0
    per_route: Counter[tuple[str, str]] = field(default_factory=Counter)
    route_streams: Counter[str] = field(default_factory=Counter)
    per_family: dict[str, Counter[int]] = field(default_factory=dict)
    family_streams: Counter[str] = field(default_factory=Counter)

    @property
    def cases(self) -> int:
        return sum(self.statuses.values())

    def summary(self) -> str:
        lines = [f"fuzzing: {self.cases} cases ({self.streams} streamed), {dict(self.statuses)}"]
        for family, statuses in sorted(self.per_family.items()):
            cases, streams = sum(statuses.values()), self.family_streams[family]
            lines.append(
                f"  {family}: {cases} ({streams} streamed), {dict(sorted(statuses.items()))}"
            )
        return "\n" + "\n".join(lines)

    def add(self, method: str, path: str, status: int, streamed: bool) -> None:
        self.statuses[status] += 1
        self.streams += streamed
        self.per_route[method, path] += 1
        self.per_family.setdefault(route_family(path), Counter())[status] += 1
        self.family_streams[route_family(path)] += streamed
        self.route_streams[path] += streamed


TALLY = Tally()


@pytest.fixture(scope="module")
def fuzz_server(model_dir: Path) -> Iterator[LiveServer]:
    engine = make_engine(
        model_dir,
        max_model_len=FUZZ_MAX_MODEL_LEN,
        override_generation_config={"max_new_tokens": DEFAULT_MAX_TOKENS},
    )
    live = start_server(model_dir, engine=engine)
    yield live
    try:
        print(TALLY.summary())
        # Guards against a run that fuzzed next to nothing (a filter that dropped routes).
        assert TALLY.cases >= MIN_CASES, TALLY
        for route in FUZZED:
            least = 1 if route in WITHOUT_INPUTS else MAX_EXAMPLES
            assert TALLY.per_route[route] >= least, (route, TALLY.per_route[route])
        # Each streaming route's stream checks ran, on streams that got their 200.
        for path in STREAMED:
            assert TALLY.route_streams[path] >= MIN_STREAMS, (path, TALLY.route_streams)
        assert not any(status >= 500 for status in TALLY.statuses), TALLY
        # After all that, the engine is idle and every KV block is back.
        assert live.state.engine.num_pending == 0
        assert live.engine.memory_stats()["used_blocks"] == 0
    finally:
        live.stop()


def config() -> schemathesis.Config:
    # Streams are read to the end (by default only their first 20 events).
    return schemathesis.Config.from_dict({"max-stream-events": 1_000_000})


@pytest.fixture(scope="module")
def api_schema(fuzz_server: LiveServer) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json", config=config())
    paths = schema.raw_schema["paths"]
    operations = {(method.upper(), path) for path, ops in paths.items() for method in ops}
    missing = set(FUZZED) - operations
    assert not missing, f"the schema lacks {missing}"
    without_inputs = {
        (method, path)
        for method, path in FUZZED
        if not {"requestBody", "parameters"} & set(paths[path][method.lower()])
    }
    assert without_inputs == WITHOUT_INPUTS, without_inputs
    return schema.include(path={path for _, path in FUZZED})


def fixed_fields(path: str) -> dict[str, Any]:
    """What every streamed body of ``path`` holds: the served model, a prompt the
    route takes, stream on."""
    return {**STREAMED[path][0], "model": MODEL_NAME, "stream": True}


@pytest.fixture(scope="module")
def streamed_schema(api_schema: schemathesis.BaseSchema) -> schemathesis.BaseSchema:
    """The schema the streamed runs draw from: each streaming route's body with the
    fields its run fixes held at their values (const) and those it leaves out gone.
    Drawn in full, a conversation or a prompt was the most of a case's cost, and
    was then replaced."""
    raw = copy.deepcopy(api_schema.raw_schema)
    for path, (_, dropped) in STREAMED.items():
        body = raw["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = body["schema"]["$ref"].removeprefix("#/components/schemas/")
        fields = raw["components"]["schemas"][name]
        fixed = fixed_fields(path)
        for field_name in ("priority", *dropped):  # priority: as valid_body leaves it out
            fields["properties"].pop(field_name, None)
        fields["properties"].update({key: {"const": value} for key, value in fixed.items()})
        required = [key for key in fields.get("required", []) if key not in dropped]
        fields["required"] = [*required, *(key for key in fixed if key not in required)]
    schema = schemathesis.openapi.from_dict(raw, config=config())
    schema.location = api_schema.location
    return schema.include(path=set(STREAMED))


def content_type(response: schemathesis.Response) -> str:
    return next(
        (
            values[0]
            for name, values in response.headers.items()
            if name.lower() == "content-type" and values
        ),
        "",
    )


def is_stream(response: schemathesis.Response) -> bool:
    return content_type(response).startswith(("text/event-stream", "application/x-ndjson"))


def check_openai_stream(text: str) -> None:
    stream = parse_stream(text)
    assert not stream.errors, f"the stream failed after its 200: {stream.errors}"
    choices = [choice for chunk in stream.chunks for choice in chunk["choices"]]
    started = {choice["index"] for choice in choices}
    finished = {choice["index"] for choice in choices if choice["finish_reason"]}
    assert started and finished == started, f"choices {started - finished} never finished"


STREAM_PARSERS = {
    "responses": parse_responses_stream,
    "anthropic": parse_anthropic_stream,
    "ollama": parse_ndjson_stream,
}


@schemathesis.check
def family_shapes(ctx, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """Errors in the route family's shape; a stream well formed in the family's way,
    finished, and with no error in-band after its 200."""
    path = case.operation.path
    family = route_family(path)
    if response.status_code >= 400:
        error_message(path, json.loads(response.text))
    elif not is_stream(response):
        return
    elif family == "openai":
        assert content_type(response).startswith("text/event-stream"), content_type(response)
        check_openai_stream(response.text)
    else:
        expected = "application/x-ndjson" if family == "ollama" else "text/event-stream"
        assert content_type(response).startswith(expected), content_type(response)
        stream = STREAM_PARSERS[family](response.text)
        assert not stream.errors, f"the stream failed after its 200: {stream.errors}"


def valid_body(case: schemathesis.Case, served_model: bool) -> schemathesis.Case:
    """A valid body leaves priority out: the test server schedules first come, first
    served, under which any priority but 0 is refused, and a schema has no room to say
    what depends on the server's settings. Half of them name the served model, which
    Anthropic's and Ollama's routes require (a name drawn at random is a 404, and the
    request would get no further). (Otherwise few valid bodies would get past.)"""
    if isinstance(case.body, dict):
        case.body.pop("priority", None)
        if served_model and "model" in case.body:
            case.body["model"] = MODEL_NAME
    return case


# Streamed bodies ask for at most this many tokens: a few more than the default's 8,
# and a prompt of a few tokens still fits the 64-token context.
STREAMED_MAX_TOKENS = 16
LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def streamed_body(case: schemathesis.Case) -> schemathesis.Case:
    """A valid body of streamed_schema's (the served model, a prompt the route takes,
    streamed), with a short limit on the output."""
    if isinstance(case.body, dict):
        fixed = fixed_fields(case.operation.path)
        assert {key: case.body.get(key) for key in fixed} == fixed, case.body
        for name in LIMIT_FIELDS:
            # JSON's 43.0 is an integer too: the schema's valid bodies hold such floats.
            limit = case.body.get(name)
            if isinstance(limit, int | float) and limit > STREAMED_MAX_TOKENS:
                case.body[name] = STREAMED_MAX_TOKENS
    return case


CHECKS = [
    not_a_server_error,
    family_shapes,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


# (Schemathesis's own pytest integration does not run under pytest 9.2, so each route
# and generation mode is a test of its own, its cases drawn by Hypothesis.)
@pytest.mark.parametrize(
    ("method", "path", "mode"), RUNS, ids=[f"{m} {p}-{mode}" for m, p, mode in RUNS]
)
def test_route_under_fuzzing(
    api_schema: schemathesis.BaseSchema,
    streamed_schema: schemathesis.BaseSchema,
    method: str,
    path: str,
    mode: GenerationMode | str,
):
    operation = api_schema[path][method]
    if mode == STREAMED_MODE:
        operation = streamed_schema[path][method]
        cases = operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
        cases = st.builds(streamed_body, cases)
    elif mode.is_positive:
        cases = st.builds(valid_body, operation.as_strategy(generation_mode=mode), st.booleans())
    else:
        cases = operation.as_strategy(generation_mode=mode)
    examples = 1 if (method, path) in WITHOUT_INPUTS else MAX_EXAMPLES

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=examples,
        database=None,  # a run never replays cases an earlier run stored
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=cases)
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(timeout=REQUEST_TIMEOUT)
        TALLY.add(method, path, response.status_code, is_stream(response))
        case.validate_response(response, checks=CHECKS)

    fuzz()
