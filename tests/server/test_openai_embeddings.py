"""/v1/embeddings through a live server, its real engine (fp32) and the official
`openai` client: each input's embedding equals transformers' pooled final hidden state on
the same tiny model, for text and token-id inputs and both poolings; base64 decodes to
the same floats; embeddings share steps with generation; bad input is a 400 naming the
field and leaves the server serving with no KV block held."""

from __future__ import annotations

import asyncio
import base64
import json
import struct

import openai
import pytest
import torch
import transformers

from tests.reference import transformers_embedding
from tests.server.conftest import MAX_MODEL_LEN, MODEL_NAME, make_engine, start_server, wait_until

TEXTS = ["Hello world and the", "is it working? " * 12, "x"]
# fp32 on both sides; the kernels sum in another order than transformers.
ATOL = 2e-5
HIDDEN_SIZE = 72  # the tiny llama's


@pytest.fixture(scope="module", params=["last", "mean"])
def pooling_server(request, model_dir):
    live = start_server(
        model_dir, engine=make_engine(model_dir, dtype="float32", pooling=request.param)
    )
    yield live, request.param
    live.stop()


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return transformers.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()


def sdk_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=60)


def check_embeddings(
    vectors: list[list[float]], token_lists, hf_model, pooling: str, normalize: bool = True
) -> None:
    assert len(vectors) == len(token_lists)
    for vector, tokens in zip(vectors, token_lists, strict=True):
        expected = transformers_embedding(hf_model, tokens, pooling, normalize)
        got = torch.tensor(vector)
        assert got.shape == (HIDDEN_SIZE,)
        assert torch.allclose(got, expected, atol=ATOL), (got - expected).abs().max()


def test_text_and_token_inputs_match_transformers(pooling_server, hf_model):
    server, pooling = pooling_server
    token_lists = [server.engine.tokenizer.encode(text) for text in TEXTS]
    with sdk_client(server.url) as client:
        # The SDK asks for base64 unless told otherwise, and decodes it.
        for encoding in ({}, {"encoding_format": "float"}):
            out = client.embeddings.create(model=MODEL_NAME, input=TEXTS, user="u-1", **encoding)
            assert out.object == "list" and out.model == MODEL_NAME
            assert [d.index for d in out.data] == [0, 1, 2]
            assert all(d.object == "embedding" for d in out.data)
            check_embeddings([d.embedding for d in out.data], token_lists, hf_model, pooling)
            num_tokens = sum(map(len, token_lists))
            assert out.usage.prompt_tokens == out.usage.total_tokens == num_tokens
        one = client.embeddings.create(model=MODEL_NAME, input=TEXTS[0], encoding_format="float")
        check_embeddings([one.data[0].embedding], token_lists[:1], hf_model, pooling)
        ids = client.embeddings.create(
            model=MODEL_NAME, input=token_lists[1], dimensions=HIDDEN_SIZE
        )
        check_embeddings([ids.data[0].embedding], token_lists[1:2], hf_model, pooling)
        many = client.embeddings.create(model=MODEL_NAME, input=token_lists)
        check_embeddings([d.embedding for d in many.data], token_lists, hf_model, pooling)
    assert server.engine.block_manager.num_used_blocks == 0


def test_vllm_token_fields(pooling_server, hf_model):
    """truncate_prompt_tokens keeps each input's last tokens (-1: all that fit);
    add_special_tokens false leaves a text input's BOS out."""
    server, pooling = pooling_server
    tokenizer = server.engine.tokenizer
    full = [tokenizer.encode(text) for text in TEXTS]
    bare = [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]
    assert bare != full  # the tokenizer adds a BOS
    cases = [
        ({"truncate_prompt_tokens": 3}, [tokens[-3:] for tokens in full]),
        ({"truncate_prompt_tokens": -1}, full),
        ({"add_special_tokens": False}, bare),
        ({"add_special_tokens": False, "truncate_prompt_tokens": 2}, [t[-2:] for t in bare]),
    ]
    with server.client() as http:
        for fields, token_lists in cases:
            body = {"model": MODEL_NAME, "input": TEXTS, "encoding_format": "float", **fields}
            out = http.post("/v1/embeddings", json=body).json()
            check_embeddings([d["embedding"] for d in out["data"]], token_lists, hf_model, pooling)
            assert out["usage"]["prompt_tokens"] == sum(map(len, token_lists))


def test_vllm_pooling_and_id_fields(pooling_server, hf_model):
    """normalize false gives the pooled hidden states as they are (null and true: unit
    length), as vLLM's; request_id names the answer ("embd-<id>"), and may come again."""
    server, pooling = pooling_server
    token_lists = [server.engine.tokenizer.encode(text) for text in TEXTS]
    body = {"model": MODEL_NAME, "input": TEXTS, "encoding_format": "float"}
    with server.client() as http:
        for normalize in (None, True, False):
            out = http.post("/v1/embeddings", json={**body, "normalize": normalize}).json()
            vectors = [d["embedding"] for d in out["data"]]
            check_embeddings(vectors, token_lists, hf_model, pooling, normalize is not False)
        assert abs(sum(x * x for x in vectors[0]) - 1) > 0.1  # not unit length by chance
        assert out["id"].startswith("embd-") and isinstance(out["created"], int)
        for _ in range(2):  # the engine's own ids stay unique
            named = http.post("/v1/embeddings", json={**body, "request_id": "run-7"})
            assert named.status_code == 200 and named.json()["id"] == "embd-run-7"
        assert http.post("/v1/embeddings", json={**body, "normalize": "maybe"}).status_code == 400
    assert server.engine.block_manager.num_used_blocks == 0


def test_messages_through_the_chat_template(pooling_server, hf_model):
    """vLLM's other form: messages through the chat template (by default no generation
    prompt, no special tokens beyond the template's), embedded as their tokens are."""
    server, pooling = pooling_server
    tokenizer = server.engine.tokenizer
    messages = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi"}]
    closed = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    bos = tokenizer.hf_tokenizer.bos_token_id
    cases = [
        ({}, closed),
        ({"add_generation_prompt": True}, tokenizer.apply_chat_template(messages)),
        ({"add_special_tokens": True}, [bos, *closed]),
        ({"truncate_prompt_tokens": 4}, closed[-4:]),
    ]
    body = {"model": MODEL_NAME, "messages": messages, "encoding_format": "float"}
    with server.client() as http:
        for fields, tokens in cases:
            out = http.post("/v1/embeddings", json={**body, **fields}).json()
            check_embeddings([out["data"][0]["embedding"]], [tokens], hf_model, pooling)
            assert out["usage"]["prompt_tokens"] == len(tokens)


def test_base64_is_little_endian_float32(pooling_server):
    server, _ = pooling_server
    # Shorter than a KV block, so the prefix cache has nothing for the second request and
    # both compute the very same floats.
    body = {"model": MODEL_NAME, "input": [[1, 7, 40, 41, 300], [1, 9]]}
    with server.client() as http:
        floats = http.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
        packed = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    for as_floats, as_base64 in zip(floats["data"], packed["data"], strict=True):
        raw = base64.b64decode(as_base64["embedding"])
        assert len(raw) == 4 * HIDDEN_SIZE
        decoded = list(struct.unpack(f"<{HIDDEN_SIZE}f", raw))
        assert decoded == as_floats["embedding"]
        assert sum(x * x for x in decoded) == pytest.approx(1.0, abs=1e-5)


EMBED_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
}  # fmt: skip


def as_dtype(raw: bytes, name: str, endianness: str) -> list[float]:
    """vLLM's bytes of an embedding as floats: the values of the dtype, in that order."""
    dtype = EMBED_DTYPES[name]
    width = torch.tensor([], dtype=dtype).element_size()
    if endianness == "big":  # each value's bytes turned round, to this machine's order
        raw = b"".join(raw[i : i + width][::-1] for i in range(0, len(raw), width))
    return torch.frombuffer(bytearray(raw), dtype=dtype).float().tolist()


@pytest.mark.parametrize("embed_dtype", EMBED_DTYPES)
def test_vllms_embed_dtype_and_endianness(pooling_server, embed_dtype):
    """base64 and vLLM's binary answers: each value rounded to embed_dtype (to nearest,
    as torch rounds), its bytes in the order asked ("native": this machine's, little)."""
    server, _ = pooling_server
    body = {"model": MODEL_NAME, "input": [[1, 7, 40, 41, 300], [1, 9]], "request_id": "b"}
    dtype = EMBED_DTYPES[embed_dtype]
    with server.client() as http:
        floats = http.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
        expected = [torch.tensor(d["embedding"]).to(dtype).float().tolist() for d in floats["data"]]
        for endianness in ("native", "little", "big"):
            fields = {**body, "embed_dtype": embed_dtype, "endianness": endianness}
            packed = http.post("/v1/embeddings", json={**fields, "encoding_format": "base64"})
            got = [
                as_dtype(base64.b64decode(d["embedding"]), embed_dtype, endianness)
                for d in packed.json()["data"]
            ]
            assert got == expected
            binary = http.post("/v1/embeddings", json={**fields, "encoding_format": "bytes"})
            assert binary.headers["content-type"] == "application/octet-stream"
            metadata = json.loads(binary.headers["metadata"])
            assert (metadata["id"], metadata["model"]) == ("embd-b", MODEL_NAME)
            assert metadata["usage"] == floats["usage"]
            width = dtype.itemsize
            assert metadata["data"] == [
                {"index": i, "embed_dtype": embed_dtype, "endianness": endianness,
                 "start": i * HIDDEN_SIZE * width, "end": (i + 1) * HIDDEN_SIZE * width,
                 "shape": [HIDDEN_SIZE]}
                for i in range(2)
            ]  # fmt: skip
            got = [
                as_dtype(binary.content[item["start"] : item["end"]], embed_dtype, endianness)
                for item in metadata["data"]
            ]
            assert got == expected
            bare = http.post("/v1/embeddings", json={**fields, "encoding_format": "bytes_only"})
            assert "metadata" not in bare.headers and bare.content == binary.content
    if embed_dtype != "float32":  # rounded: not the floats themselves
        assert expected != [d["embedding"] for d in floats["data"]]


def test_shares_steps_with_generation(pooling_server, hf_model):
    """Embedding requests sent while a generation streams join its steps: they finish
    before it does, exact, and the generation's text is what it is alone."""
    server, pooling = pooling_server
    request = dict(
        model=MODEL_NAME, prompt="Hello world and the", max_tokens=200, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    token_lists = [[1, *range(10, 10 + n)] for n in (3, 30, 90)]
    client = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)

    async def embeddings():
        return await asyncio.gather(
            *(client.embeddings.create(model=MODEL_NAME, input=t) for t in token_lists)
        )

    async def main():
        async with client:
            alone = await client.completions.create(**request)
            texts, task, done_first = [], None, False
            async for chunk in await client.completions.create(**request, stream=True):
                texts.append(chunk.choices[0].text)
                if task is None:  # the generation runs: send the embeddings now
                    task = asyncio.ensure_future(embeddings())
            done_first = task.done()
            return alone.choices[0].text, "".join(texts), await task, done_first

    alone, streamed, outs, done_first = asyncio.run(main())
    assert streamed == alone
    assert done_first
    check_embeddings([o.data[0].embedding for o in outs], token_lists, hf_model, pooling)
    wait_until(lambda: server.engine.block_manager.num_used_blocks == 0, 10, "blocks freed")


BAD_INPUTS = [
    ({"input": ""}, "input"),
    ({"input": []}, "input"),
    ({"input": [[]]}, "input"),
    ({"input": [[1, 2], []]}, "input"),
    ({"input": [1, 999999]}, "input"),
    ({"input": [-1]}, "input"),
    ({"input": [[1, 2], "text"]}, "input"),
    ({"input": ["x"] * 2049}, "input"),
    ({"input": [5] * (MAX_MODEL_LEN + 1)}, "input"),
    ({"input": "hello " * MAX_MODEL_LEN}, "input"),
    ({"input": "x", "dimensions": 8}, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "embed_dtype": "int8"}, "embed_dtype"),
    ({"input": "x", "endianness": "middle"}, "endianness"),
    ({"input": "x", "truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ({"input": "x", "truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
    ({}, "input"),
    ({"input": "x", "messages": [{"role": "user", "content": "x"}]}, "input"),
    ({"messages": []}, "messages"),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "add_generation_prompt": True,
            "continue_final_message": True,
        },
        "continue_final_message",
    ),
]


@pytest.mark.parametrize("body, param", BAD_INPUTS)
def test_bad_input_is_a_400_naming_the_field(pooling_server, body, param):
    server, _ = pooling_server
    with server.client() as http:
        response = http.post("/v1/embeddings", json={"model": MODEL_NAME, **body})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert error["message"]
        if "maximum context length" in error["message"]:
            assert error["code"] == "context_length_exceeded"
        # The server goes on serving, with nothing left behind.
        assert http.post("/v1/embeddings", json={"input": "ok"}).status_code == 200
    assert server.engine.block_manager.num_used_blocks == 0


def test_unknown_model_is_a_404(pooling_server):
    server, _ = pooling_server
    with server.client() as http:
        response = http.post("/v1/embeddings", json={"model": "other", "input": "x"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"


def test_the_sdk_raises_on_a_400(pooling_server):
    server, _ = pooling_server
    with sdk_client(server.url) as client, pytest.raises(openai.BadRequestError) as error:
        client.embeddings.create(model=MODEL_NAME, input="x", dimensions=16)
    assert error.value.body["param"] == "dimensions"
