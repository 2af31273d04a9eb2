"""response_format through the official `openai` client: json_schema and json_object,
streamed and not; the text parses and the schema validates it."""

from __future__ import annotations

import json

import jsonschema

from tests.engine.test_json_schema import SMALL
from tests.server.conftest import MODEL_NAME

MESSAGES = [{"role": "user", "content": "Give me a colour."}]


def test_chat_json_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}}
    kw = dict(model=MODEL_NAME, messages=MESSAGES, max_tokens=100, response_format=fmt)
    out = client.chat.completions.create(temperature=0.8, seed=1, n=2, **kw)
    for choice in out.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SMALL)
    stream = client.chat.completions.create(temperature=0.8, seed=1, stream=True, **kw)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == out.choices[0].message.content


def test_completion_json_object(client):
    out = client.completions.create(
        model=MODEL_NAME,
        prompt="JSON:",
        max_tokens=200,
        temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    text = out.choices[0].text
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a random model may write one endless string: still JSON so far
        assert text.startswith("{")
