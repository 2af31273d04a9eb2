"""Tools for a chat template that does not render them: a generic tool prompt.

Many templates ignore ``tools`` (SmolLM2's among them): the prompt would be the same
with tools or without, and the model would never learn of them. For such a template
(``Tokenizer.renders_tools``) the conversation is rewritten into what every template
renders, as llama.cpp does for templates without tool support:

- the tools, as JSON, and how to call one, in the system message (one is added where
  the conversation has none);
- an assistant's earlier calls, written into its text in that same format;
- tool results, as user messages (consecutive results in one).

A call is written in the format of the server's ``--tool-call-parser`` (hermes's
without one), so that what the model writes back is read as calls.
"""

from __future__ import annotations

import json
from typing import Any

from hetero_infer.server.serving.tool_parsers import TOOL_PARSERS, ToolParser
from hetero_infer.server.serving.tool_parsers.base import Call
from hetero_infer.server.serving.tool_parsers.hermes import HermesToolParser

TOOL_PROMPT = """You can call the following tools. Each is a JSON object with the \
tool's name, what it does, and a JSON schema of its arguments:
{tools}

To call a tool, answer with the call alone, written like this:
{example}
Then wait for its result. Answer in plain text when no tool is needed."""


def with_tool_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], parser_name: str | None
) -> list[dict[str, Any]]:
    """``messages`` (as templates take them) rewritten to carry ``tools`` (OpenAI's
    function definitions) for a template that renders no tools."""
    parser = TOOL_PARSERS[parser_name] if parser_name else HermesToolParser
    functions = [tool["function"] for tool in tools]
    prompt = TOOL_PROMPT.format(
        tools="\n".join(json.dumps(function) for function in functions),
        example=parser.write_calls([_example_call(functions[0])]),
    )
    rewritten: list[dict[str, Any]] = []
    if not messages or messages[0]["role"] != "system":
        rewritten.append({"role": "system", "content": prompt})
    previous_role = None
    for i, message in enumerate(messages):
        if i == 0 and message["role"] == "system":
            content = message["content"]
            rewritten.append(
                {**message, "content": f"{content}\n\n{prompt}" if content else prompt}
            )
        elif message["role"] == "tool":
            result = f"<tool_response>\n{message.get('content') or ''}\n</tool_response>"
            if previous_role == "tool":
                rewritten[-1]["content"] += "\n" + result
            else:
                rewritten.append({"role": "user", "content": result})
        elif message.get("tool_calls"):
            rewritten.append(_with_calls_written(message, parser))
        else:
            rewritten.append(message)
        previous_role = message["role"]
    return rewritten


def _example_call(function: dict[str, Any]) -> Call:
    """A call of ``function`` whose arguments name its parameters' types."""
    properties = (function.get("parameters") or {}).get("properties") or {}
    arguments = {
        name: f"<{schema.get('type', 'value')}>" if isinstance(schema, dict) else "<value>"
        for name, schema in properties.items()
    }
    return function["name"], arguments


def _with_calls_written(message: dict[str, Any], parser: type[ToolParser]) -> dict[str, Any]:
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    text = parser.write_calls(calls)
    content = message.get("content")
    rewritten = {k: v for k, v in message.items() if k != "tool_calls"}
    rewritten["content"] = f"{content}\n{text}" if content else text
    return rewritten
