"""Schemathesis fuzzes the OpenAI routes from the live server's own /openapi.json, against
the real engine on a tiny model: for each route, bodies the schema calls valid and
bodies that break it, drawn by Hypothesis from a fixed seed (every run sends the same).

Every answer: no 5xx; every error body in OpenAI's shape, a stream's in-band errors too
(and a stream after its 200 reports none and finishes every choice); the status,
content type and body as the route documents them (server/openai/answers.py).

Not checked: that every body the schema calls valid is accepted, as a schema cannot say
everything the server refuses (a prompt longer than the context, a model it does not
serve, a token id outside the vocabulary); nor that every body it calls invalid is
refused, as pydantic's lax mode takes 1 for true and "5" for 5 in the sampling fields
(token ids it no longer takes so: test_fuzz_regressions.py).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.server.conftest import LiveServer, make_engine, start_server
from tests.server.openai_shapes import check_error_body, parse_stream

pytestmark = pytest.mark.slow

FUZZED_PATHS = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/models",
    "/tokenize",
    "/detokenize",
]
# Valid bodies and invalid ones for each route; GET /v1/models has no input to break.
RUNS = [
    (path, mode)
    for path in FUZZED_PATHS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if (path, mode) != ("/v1/models", GenerationMode.NEGATIVE)
]
SEED = 20261125
# Bodies per route and mode: about 30 s for all of them on 2 cores.
MAX_EXAMPLES = 150
# The fuzzer's max_tokens and n run to the schema's bounds: the server's context keeps
# each request's work small (prompt + output <= 64 tokens), and a request without
# max_tokens gets 8 (the model's default, as a generation config would give it).
FUZZ_MAX_MODEL_LEN = 64
DEFAULT_MAX_TOKENS = 8
REQUEST_TIMEOUT = 60.0
# Fewer cases than this means routes went unfuzzed (GET /v1/models, with no inputs,
# gets one case; each other route at least MAX_EXAMPLES).
MIN_CASES = (len(FUZZED_PATHS) - 1) * MAX_EXAMPLES


@dataclass
class Tally:
    """What the fuzzer sent and got, for the figures in docs/reliability.md."""

    statuses: Counter[int] = field(default_factory=Counter)
    streams: int = 0

    @property
    def cases(self) -> int:
        return sum(self.statuses.values())


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
        print(f"\nfuzzing: {TALLY.cases} cases ({TALLY.streams} streamed), {dict(TALLY.statuses)}")
        # Guards against a run that fuzzed next to nothing (a filter that dropped routes).
        assert TALLY.cases >= MIN_CASES, TALLY
        assert not any(status >= 500 for status in TALLY.statuses), TALLY
        # After all that, the engine is idle and every KV block is back.
        assert live.state.engine.num_pending == 0
        assert live.engine.memory_stats()["used_blocks"] == 0
    finally:
        live.stop()


@pytest.fixture(scope="module")
def api_schema(fuzz_server: LiveServer) -> schemathesis.BaseSchema:
    # Streams are read to the end (by default only their first 20 events).
    config = schemathesis.Config.from_dict({"max-stream-events": 1_000_000})
    schema = schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json", config=config)
    missing = set(FUZZED_PATHS) - set(schema.raw_schema["paths"])
    assert not missing, f"the schema lacks {missing}"
    return schema.include(path=FUZZED_PATHS)


def is_stream(response: schemathesis.Response) -> bool:
    return any(
        value.startswith("text/event-stream")
        for name, values in response.headers.items()
        if name.lower() == "content-type"
        for value in values
    )


@schemathesis.check
def openai_shapes(ctx, response: schemathesis.Response, case: schemathesis.Case) -> None:
    """Errors in OpenAI's shape; a stream well formed, every choice in it finished, and
    no error in-band after its 200."""
    if response.status_code >= 400:
        check_error_body(json.loads(response.text))
    elif is_stream(response):
        stream = parse_stream(response.text)
        assert not stream.errors, f"the stream failed after its 200: {stream.errors}"
        choices = [choice for chunk in stream.chunks for choice in chunk["choices"]]
        started = {choice["index"] for choice in choices}
        finished = {choice["index"] for choice in choices if choice["finish_reason"]}
        assert started and finished == started, f"choices {started - finished} never finished"


def without_priority(case: schemathesis.Case) -> schemathesis.Case:
    """A valid body leaves priority out: the test server schedules first come, first
    served, under which any priority but 0 is refused, and a schema has no room to say
    what depends on the server's settings. (Otherwise few valid bodies would get past.)"""
    if isinstance(case.body, dict):
        case.body.pop("priority", None)
    return case


CHECKS = [
    not_a_server_error,
    openai_shapes,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


# (Schemathesis's own pytest integration does not run under pytest 9.2, so each route
# and generation mode is a test of its own, its cases drawn by Hypothesis.)
@pytest.mark.parametrize(("path", "mode"), RUNS, ids=[f"{path}-{mode}" for path, mode in RUNS])
def test_route_under_fuzzing(api_schema: schemathesis.BaseSchema, path: str, mode: GenerationMode):
    [method] = api_schema.raw_schema["paths"][path]
    cases = api_schema[path][method].as_strategy(generation_mode=mode)
    if mode.is_positive:
        cases = cases.map(without_priority)

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        database=None,  # a run never replays cases an earlier run stored
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=cases)
    def fuzz(case: schemathesis.Case) -> None:
        response = case.call(timeout=REQUEST_TIMEOUT)
        TALLY.statuses[response.status_code] += 1
        TALLY.streams += is_stream(response)
        case.validate_response(response, checks=CHECKS)

    fuzz()
