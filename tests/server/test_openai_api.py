"""The official `openai` client against a live server: completions and chat, streaming
and not, usage chunks, prompt forms, /v1/models, /tokenize and /detokenize.

Greedy text over HTTP must equal `LLMEngine.generate` on the same prompt.
"""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.entrypoints.outputs import RequestOutput
from hetero_infer.engine.params.sampling_params import SamplingParams
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from tests.server.conftest import MODEL_NAME, LiveServer

PROMPT = "Hello world and the"
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello there, is it working?"},
]
MAX_TOKENS = 12


def greedy(engine: LLMEngine, prompt: str | list[int], max_tokens: int = MAX_TOKENS, **kw):
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)
    return engine.generate(prompt, params, use_tqdm=False)[0]


def greedy_chat(engine: LLMEngine, messages: list[dict], max_tokens: int = MAX_TOKENS, **kw):
    return greedy(engine, engine.tokenizer.apply_chat_template(messages), max_tokens, **kw)


def async_client(server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)


def check_completion_chunks(chunks: list[Completion], expected: RequestOutput) -> None:
    """Text chunks then, only if asked, one usage chunk; finish_reason on the last text one.
    A chunk without text is only the last (a token whose text is still held back, as
    PROMPT's first ones, bytes of one character, are, rides on a later chunk)."""
    assert chunks and all(isinstance(c, Completion) for c in chunks)
    assert all(c.choices and c.usage is None for c in chunks)
    assert all(c.choices[0].text for c in chunks[:-1])
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert len({c.id for c in chunks}) == 1


def check_chat_chunks(chunks: list[ChatCompletionChunk], expected: RequestOutput) -> None:
    assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.content for c in chunks[1:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.text
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason
    assert all(c.object == "chat.completion.chunk" and c.model == MODEL_NAME for c in chunks)


def check_usage_chunk(chunk, prompt_tokens: int, completion_tokens: int) -> None:
    assert chunk.choices == []
    assert chunk.usage.prompt_tokens == prompt_tokens
    assert chunk.usage.completion_tokens == completion_tokens
    assert chunk.usage.total_tokens == prompt_tokens + completion_tokens


# ---- sync client ----


def test_completion(client, reference_engine):
    expected = greedy(reference_engine, PROMPT)
    out = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
    )
    assert isinstance(out, Completion) and out.object == "text_completion"
    assert out.model == MODEL_NAME and len(out.choices) == 1
    assert out.choices[0].text == expected.text
    assert out.choices[0].finish_reason == expected.finish_reason
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert out.usage.completion_tokens == len(expected.token_ids)


def test_completion_stream_without_usage(client, reference_engine):
    expected = greedy(reference_engine, PROMPT)
    stream = client.completions.create(
        model=MODEL_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    check_completion_chunks(list(stream), expected)


def test_completion_stream_with_usage(client, reference_engine):
    expected = greedy(reference_engine, PROMPT)
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    *chunks, last = list(stream)
    check_completion_chunks(chunks, expected)
    check_usage_chunk(last, len(expected.prompt_token_ids), len(expected.token_ids))


def test_chat(client, reference_engine):
    expected = greedy_chat(reference_engine, MESSAGES)
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
    )
    assert isinstance(out, ChatCompletion) and out.object == "chat.completion"
    choice = out.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert out.usage.completion_tokens == len(expected.token_ids)


def test_chat_stream_without_usage(client, reference_engine):
    expected = greedy_chat(reference_engine, MESSAGES)
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    check_chat_chunks(list(stream), expected)


def test_chat_stream_with_usage(client, reference_engine):
    expected = greedy_chat(reference_engine, MESSAGES)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    *chunks, last = list(stream)
    check_chat_chunks(chunks, expected)
    check_usage_chunk(last, len(expected.prompt_token_ids), len(expected.token_ids))


# vLLM's continuous usage stats: with include_usage, every chunk carries the usage so far.
CONTINUOUS_USAGE = {"include_usage": True, "continuous_usage_stats": True}


def check_continuous_usage(chunks, prompt_tokens: int, completion_tokens: int) -> None:
    """Every content chunk carries the usage so far: the prompt tokens throughout, the
    completion tokens never falling, the last content chunk's equal to the usage chunk's."""
    *content, last = chunks
    check_usage_chunk(last, prompt_tokens, completion_tokens)
    assert content and all(c.choices for c in content)
    counts = [c.usage.completion_tokens for c in content]
    assert counts == sorted(counts) and counts[-1] == completion_tokens
    for chunk in content:
        assert chunk.usage.prompt_tokens == prompt_tokens
        assert chunk.usage.total_tokens == prompt_tokens + chunk.usage.completion_tokens


def test_completion_stream_with_continuous_usage(client, reference_engine):
    prompts = [PROMPT, "the world is"]
    expected = [greedy(reference_engine, prompt) for prompt in prompts]
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=prompts,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options=CONTINUOUS_USAGE,
    )
    chunks = list(stream)
    for i, out in enumerate(expected):
        texts = [c.choices[0].text for c in chunks[:-1] if c.choices[0].index == i]
        assert "".join(texts) == out.text
    prompt_tokens = sum(len(out.prompt_token_ids) for out in expected)
    check_continuous_usage(chunks, prompt_tokens, sum(len(out.token_ids) for out in expected))


def test_chat_stream_with_continuous_usage(client, reference_engine):
    expected = greedy_chat(reference_engine, MESSAGES)
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options=CONTINUOUS_USAGE,
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.choices[0].delta.content for c in chunks[1:-1])
    assert chunks[0].usage.completion_tokens == 0  # the role chunk
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == expected.text
    check_continuous_usage(chunks, len(expected.prompt_token_ids), len(expected.token_ids))


def test_continuous_usage_needs_include_usage(client):
    """As in vLLM: continuous_usage_stats alone adds nothing."""
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=4,
        stream=True,
        stream_options={"continuous_usage_stats": True},
    )
    chunks = list(stream)
    assert all(c.choices and c.usage is None for c in chunks)


def test_a_stream_ending_on_a_token_without_text_sends_its_finish(client, server):
    """The end-of-sequence token has no text (a special token, skipped): the chunk of
    the step that ends on it still comes, empty, with the finish_reason."""
    eos = server.engine.tokenizer.hf_tokenizer.eos_token_id
    forced = {"max_tokens": 5, "logit_bias": {str(eos): 100}, "stream": True}
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, **forced))
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks] == [("", "stop")]
    chat = list(client.chat.completions.create(model=MODEL_NAME, messages=MESSAGES, **forced))
    last = chat[-1].choices[0]
    assert last.finish_reason == "stop" and not last.delta.content


def test_chat_max_completion_tokens(client, reference_engine):
    expected = greedy_chat(reference_engine, MESSAGES, max_tokens=7, ignore_eos=True)
    out = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_completion_tokens=7,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.usage.completion_tokens == 7
    assert out.choices[0].finish_reason == "length"
    assert out.choices[0].message.content == expected.text


def test_chat_content_as_text_parts(client, reference_engine):
    expected = greedy_chat(reference_engine, MESSAGES)
    parts = [
        MESSAGES[0],
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hello there, "},
                {"type": "text", "text": "is it working?"},
            ],
        },
    ]
    out = client.chat.completions.create(
        model=MODEL_NAME, messages=parts, max_tokens=MAX_TOKENS, temperature=0
    )
    assert out.choices[0].message.content == expected.text
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)


def test_raw_bodies_validate_as_sdk_types(server: LiveServer):
    """Strict pydantic validation with the SDK's types (the client itself skips it)."""
    completion = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 4}
    chat = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4}
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    with server.client() as http:
        Completion.model_validate(http.post("/v1/completions", json=completion).json())
        ChatCompletion.model_validate(http.post("/v1/chat/completions", json=chat).json())
        for path, body, kind in (
            ("/v1/completions", completion, Completion),
            ("/v1/chat/completions", chat, ChatCompletionChunk),
        ):
            lines = http.post(path, json={**body, **usage}).text.splitlines()
            data = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
            assert data[-1] == "[DONE]"
            for chunk in data[:-1]:
                body = json.loads(chunk)
                if kind is Completion:
                    # The SDK reads completion chunks as Completion, whose finish_reason
                    # admits no null: OpenAI's chunks carry null until the last.
                    for choice in body["choices"]:
                        assert choice["finish_reason"] in (None, "length", "stop")
                        choice["finish_reason"] = choice["finish_reason"] or "length"
                kind.model_validate(body)


# ---- prompt forms ----


def test_prompt_as_list_of_strings(client, reference_engine):
    prompts = ["Hello world", "the cat is on", "and then"]
    out = client.completions.create(
        model=MODEL_NAME, prompt=prompts, max_tokens=MAX_TOKENS, temperature=0
    )
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    expected = [greedy(reference_engine, p) for p in prompts]
    for choice in out.choices:
        assert choice.text == expected[choice.index].text
    assert out.usage.prompt_tokens == sum(len(e.prompt_token_ids) for e in expected)
    assert out.usage.completion_tokens == sum(len(e.token_ids) for e in expected)


def test_prompt_as_token_ids(client, reference_engine):
    ids = reference_engine.tokenizer.encode(PROMPT)
    out = client.completions.create(
        model=MODEL_NAME, prompt=ids, max_tokens=MAX_TOKENS, temperature=0
    )
    assert out.choices[0].text == greedy(reference_engine, PROMPT).text
    assert out.usage.prompt_tokens == len(ids)


def test_prompt_as_list_of_token_id_lists(client, reference_engine):
    lists = [[1, 100, 200, 300], [1, 50, 60], [7]]
    out = client.completions.create(
        model=MODEL_NAME, prompt=lists, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    texts = ["", "", ""]
    finished = set()
    for chunk in out:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1, 2}
    assert texts == [greedy(reference_engine, ids).text for ids in lists]


# ---- async client ----


def test_async_client(server, reference_engine):
    expected_text = greedy(reference_engine, PROMPT)
    expected_chat = greedy_chat(reference_engine, MESSAGES)

    async def main():
        async with async_client(server) as client:
            plain = await client.completions.create(
                model=MODEL_NAME, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
            )
            stream = await client.completions.create(
                model=MODEL_NAME,
                prompt=PROMPT,
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            text_chunks = [c async for c in stream]
            chat = await client.chat.completions.create(
                model=MODEL_NAME, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
            )
            stream = await client.chat.completions.create(
                model=MODEL_NAME,
                messages=MESSAGES,
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
            )
            chat_chunks = [c async for c in stream]
            models = await client.models.list()
            return plain, text_chunks, chat, chat_chunks, models

    plain, text_chunks, chat, chat_chunks, models = asyncio.run(main())
    assert plain.choices[0].text == expected_text.text
    check_completion_chunks(text_chunks[:-1], expected_text)
    check_usage_chunk(
        text_chunks[-1], len(expected_text.prompt_token_ids), len(expected_text.token_ids)
    )
    assert chat.choices[0].message.content == expected_chat.text
    check_chat_chunks(chat_chunks, expected_chat)
    assert [m.id for m in models.data] == [MODEL_NAME]


# ---- models, tokenizer ----


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert models.data[0].object == "model"
    assert models.data[0].owned_by
    raw = server.client().get("/v1/models").json()
    assert raw["object"] == "list"
    assert raw["data"][0]["max_model_len"] == server.engine.max_model_len
    check_model_card(raw["data"][0], MODEL_NAME, server.settings.engine.model)


def test_retrieve_a_model(client, server):
    """OpenAI's GET /v1/models/{model}: a served name's card as /v1/models lists it, a
    404 in the error shape for any other name."""
    card = client.models.retrieve(MODEL_NAME)
    assert card.id == MODEL_NAME and card.object == "model" and card.owned_by
    raw = server.client().get(f"/v1/models/{MODEL_NAME}").json()
    check_model_card(raw, MODEL_NAME, server.settings.engine.model)
    assert raw["max_model_len"] == server.engine.max_model_len
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("not-served")
    error = info.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "not-served" in error["message"]


def check_model_card(card: dict, name: str, root: str) -> None:
    """A card as vLLM gives it, permission included."""
    assert card["id"] == name and card["object"] == "model"
    assert isinstance(card["created"], int) and card["owned_by"]
    assert card["root"] == root and card["parent"] is None
    [permission] = card["permission"]
    assert permission["id"].startswith("modelperm-")
    assert isinstance(permission["created"], int)
    assert {k: v for k, v in permission.items() if k not in ("id", "created")} == {
        "object": "model_permission",
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def test_tokenize_and_detokenize(server):
    tokenizer = server.engine.tokenizer
    with server.client() as http:
        out = http.post("/tokenize", json={"model": MODEL_NAME, "prompt": PROMPT}).json()
        assert out["tokens"] == tokenizer.encode(PROMPT)
        assert out["count"] == len(out["tokens"])
        assert out["max_model_len"] == server.engine.max_model_len
        bare = http.post("/tokenize", json={"prompt": PROMPT, "add_special_tokens": False})
        assert bare.json()["tokens"] == tokenizer.encode(PROMPT, add_special_tokens=False)
        chat = http.post("/tokenize", json={"messages": MESSAGES}).json()
        assert chat["tokens"] == tokenizer.apply_chat_template(MESSAGES)
        text = http.post("/detokenize", json={"tokens": out["tokens"]}).json()
        assert text == {"prompt": PROMPT}
        # Any id of the vocabulary decodes, its first and last too; one outside is a 400.
        vocab = server.engine.model_config.vocab_size
        edges = http.post("/detokenize", json={"tokens": [0, vocab - 1]}).json()
        assert edges == {"prompt": tokenizer.decode([0, vocab - 1])}
        for tokens in ([vocab], [5, vocab], [-1, 5]):
            refused = http.post("/detokenize", json={"tokens": tokens})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "tokens"


def test_tokenize_token_strings(server):
    hf = server.engine.tokenizer.hf_tokenizer
    with server.client() as http:
        plain = http.post("/tokenize", json={"prompt": PROMPT}).json()
        assert plain["token_strs"] is None
        out = http.post("/tokenize", json={"prompt": PROMPT, "return_token_strs": True}).json()
        assert out["token_strs"] == hf.convert_ids_to_tokens(out["tokens"])
        chat = {"messages": MESSAGES, "return_token_strs": True}
        chat_out = http.post("/tokenize", json=chat).json()
        assert chat_out["token_strs"] == hf.convert_ids_to_tokens(chat_out["tokens"])
        assert len(chat_out["token_strs"]) == chat_out["count"] > out["count"]


PREFILLED = [*MESSAGES, {"role": "assistant", "content": "The answer"}]


@pytest.mark.parametrize(
    ("messages", "flags"),
    [
        (MESSAGES, {}),
        (MESSAGES, {"add_generation_prompt": False}),
        (PREFILLED, {"add_generation_prompt": False, "continue_final_message": True}),
        (PREFILLED, {"add_generation_prompt": False}),
    ],
    ids=["generation-prompt", "none", "continued", "closed"],
)
def test_tokenize_counts_what_a_chat_request_prompts(server, messages, flags):
    """vLLM's template flags on /tokenize: the tokens the chat route's prompt has."""
    tokenizer = server.engine.tokenizer
    continued = flags.get("continue_final_message", False)
    expected = tokenizer.apply_chat_template(
        messages, flags.get("add_generation_prompt", True), continue_final_message=continued
    )
    with server.client() as http:
        out = http.post("/tokenize", json={"messages": messages, **flags}).json()
        chat = {"model": MODEL_NAME, "messages": messages, "max_tokens": 1, **flags}
        usage = http.post("/v1/chat/completions", json=chat).json()["usage"]
    assert out["tokens"] == expected and out["count"] == usage["prompt_tokens"]


def test_tokenize_counts_the_tools_a_chat_request_prompts_with(server):
    """Tools on /tokenize reach the template as the chat route's do."""
    tools = [
        {"type": "function", "function": {"name": "now"}},  # no description, no parameters
        {"type": "function", "function": {"name": "add", "description": "Adds.",
                                          "parameters": {"type": "object"}}},
    ]  # fmt: skip
    with server.client() as http:
        alone = http.post("/tokenize", json={"messages": MESSAGES}).json()
        out = http.post("/tokenize", json={"messages": MESSAGES, "tools": tools}).json()
        chat = {
            "model": MODEL_NAME,
            "messages": MESSAGES,
            "tools": tools,
            "tool_choice": "required",
            "max_tokens": 1,
        }
        answer = http.post("/v1/chat/completions", json={**chat, "return_token_ids": True})
    assert answer.status_code == 200, answer.text
    assert out["count"] > alone["count"]
    assert out["tokens"] == answer.json()["prompt_token_ids"]


@pytest.mark.parametrize(
    ("messages", "flags"),
    [
        (PREFILLED, {"continue_final_message": True}),  # and the generation prompt
        (MESSAGES, {"add_generation_prompt": False, "continue_final_message": True}),
        ([], {"add_generation_prompt": False, "continue_final_message": True}),
    ],
    ids=["both-ends", "continue-a-user-message", "continue-nothing"],
)
def test_tokenize_refuses_template_flags_that_cannot_hold(server, messages, flags):
    with server.client() as http:
        response = http.post("/tokenize", json={"messages": messages, **flags})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "continue_final_message"
