"""The generic tool prompt for templates that render no tools (tool_prompt.py)."""

from __future__ import annotations

import json

from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS
from hetero_infer.server.serving.tool_prompt import with_tool_prompt

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
PARIS = {"name": "get_weather", "arguments": {"city": "Paris"}}
CALL = {"id": "c1", "type": "function", "function": PARIS}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
]


def test_the_tools_and_the_call_format_in_a_system_message():
    system, user = with_tool_prompt(CONVERSATION[:1], [WEATHER], "hermes")
    assert system["role"] == "system" and user == CONVERSATION[0]
    assert json.dumps(WEATHER["function"]) in system["content"]
    example = TOOL_PARSERS["hermes"].write_calls([("get_weather", {"city": "<string>"})])
    assert example in system["content"]


def test_the_conversations_own_system_message_keeps_its_text_first():
    messages = [{"role": "system", "content": "Be brief."}, CONVERSATION[0]]
    system, _ = with_tool_prompt(messages, [WEATHER], None)
    assert system["content"].startswith("Be brief.\n\n") and "get_weather" in system["content"]
    assert "<tool_call>" in system["content"]  # hermes's format without a parser


def test_earlier_calls_and_their_results_as_text():
    for name, parser in TOOL_PARSERS.items():
        _, _, assistant, results = with_tool_prompt(CONVERSATION, [WEATHER], name)
        written = parser.write_calls([("get_weather", {"city": "Paris"})] * 2)
        assert assistant == {"role": "assistant", "content": written}, name
        one_message = "\n".join(f"<tool_response>\n{t}\n</tool_response>" for t in ("18 C", "21 C"))
        assert results == {"role": "user", "content": one_message}
