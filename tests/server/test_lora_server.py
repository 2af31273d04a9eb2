"""LoRA adapters on the server, as vLLM serves them: --enable-lora and --lora-modules,
/v1/load_lora_adapter and /v1/unload_lora_adapter, the ``model`` field naming an
adapter, adapters listed in /v1/models with their parent, vllm:lora_requests_info;
what cannot be served refused with a 400 naming the problem; adapters loaded and
unloaded while requests run, with no 5xx and nothing leaked. Against the real engine
on the tiny model, in fp32, its answers compared with an offline engine's."""

from __future__ import annotations

import asyncio
import json
import shutil

import httpx
import pytest
from hetero_infer.engine import SamplingParams
from prometheus_client.parser import text_string_to_metric_families

from tests.lora_adapters import save_adapter
from tests.server.conftest import MODEL_NAME, make_engine, start_server, wait_until
from tests.server.gauges import is_idle
from tests.server.test_cli import settings_for
from tests.tiny_models import save_tiny_model

LORA = dict(dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8)
PROMPT = [5, 17, 29, 41, 53, 60]


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    other = save_tiny_model("qwen2", root / "qwen2")
    return {
        "a": save_adapter(model_dir, root / "a", seed=21),
        "b": save_adapter(model_dir, root / "b", seed=22, rank=4),
        "high": save_adapter(model_dir, root / "high", seed=23, rank=16),
        "other": save_adapter(other, root / "other", seed=24),
    }


@pytest.fixture(scope="module")
def expected(model_dir, adapters):
    """The offline engine's greedy text for PROMPT, per adapter (None: the base)."""
    engine = make_engine(model_dir, **LORA)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    answers = {}
    for name in (None, "a", "b"):
        if name is not None:
            engine.adapters.load(name, str(adapters[name]))
        [out] = engine.generate([PROMPT], params, use_tqdm=False, lora_request=name)
        answers[name] = out.text
    assert len(set(answers.values())) == 3
    return answers


@pytest.fixture(scope="module")
def live(model_dir, adapters):
    engine = make_engine(model_dir, **LORA)
    server = start_server(model_dir, engine, lora_modules=(("a", str(adapters["a"])),))
    yield server
    server.stop()


def complete(http: httpx.Client, model: str, **fields) -> httpx.Response:
    body = {"model": model, "prompt": PROMPT, "max_tokens": 16, "temperature": 0.0}
    return http.post("/v1/completions", json={**body, "ignore_eos": True, **fields})


def text_of(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def listed(http: httpx.Client) -> dict[str, dict]:
    return {card["id"]: card for card in http.get("/v1/models").json()["data"]}


def test_model_field_selects_the_adapter(live, adapters, expected):
    with live.client() as http:
        cards = listed(http)
        assert cards["a"]["parent"] == MODEL_NAME and cards["a"]["root"] == str(adapters["a"])
        assert cards[MODEL_NAME]["parent"] is None
        retrieved = http.get("/v1/models/a").json()  # the adapter's own card
        assert (retrieved["parent"], retrieved["root"]) == (MODEL_NAME, str(adapters["a"]))
        answer = complete(http, "a")
        assert text_of(answer) == expected["a"] and answer.json()["model"] == "a"
        assert text_of(complete(http, MODEL_NAME)) == expected[None]
        missing = complete(http, "b")
        assert missing.status_code == 404 and "`b` does not exist" in missing.text


def test_load_refusals_name_the_problem_and_change_nothing(live, adapters, tmp_path):
    broken = shutil.copytree(adapters["b"], tmp_path / "broken")
    (broken / "adapter_config.json").unlink()
    cases = {
        "high": (adapters["high"], "rank 16, above max_lora_rank (8)"),
        "other": (adapters["other"], "does not fit this model"),
        "broken": (broken, "adapter_config.json is missing"),
        "a": (adapters["a"], "'a' is already loaded"),
        MODEL_NAME: (adapters["b"], "is the base model's name"),
    }
    with live.client() as http:
        before = listed(http)
        for name, (path, message) in cases.items():
            response = http.post(
                "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}
            )
            assert response.status_code == 400, (name, response.text)
            error = response.json()["error"]
            assert message in error["message"] and error["type"] == "invalid_request_error"
        assert listed(http).keys() == before.keys()
        gone = http.post("/v1/unload_lora_adapter", json={"lora_name": "nope"})
        assert gone.status_code == 404 and "'nope' is not loaded" in gone.text
    assert set(live.engine.lora.registry.slots) == {1}


def test_load_use_and_unload_at_run_time(live, adapters, expected):
    with live.client() as http:
        body = {"lora_name": "b", "lora_path": str(adapters["b"])}
        loaded = http.post("/v1/load_lora_adapter", json=body)
        assert loaded.status_code == 200 and "added successfully" in loaded.text
        assert listed(http)["b"]["parent"] == MODEL_NAME
        assert text_of(complete(http, "b")) == expected["b"]
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        assert chat.status_code == 200 and chat.json()["model"] == "b"
        removed = http.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
        assert removed.status_code == 200 and "removed successfully" in removed.text
        assert "b" not in listed(http)
        assert complete(http, "b").status_code == 404
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "b"}).status_code == 404


def lora_info(http: httpx.Client) -> dict[str, str]:
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name == "vllm:lora_requests_info":
            return family.samples[0].labels
    raise AssertionError("no vllm:lora_requests_info")


async def stream_tokens(client: httpx.AsyncClient, model: str, max_tokens: int) -> tuple[int, int]:
    """(status, completion tokens the usage reports) of one streamed completion."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "stream": True}
    body.update(temperature=0.0, ignore_eos=True, stream_options={"include_usage": True})
    tokens = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: {") and (usage := json.loads(line[6:]).get("usage")):
                tokens = usage["completion_tokens"]
        return response.status_code, tokens


def test_unload_while_requests_run_then_churn_under_load(live, adapters, expected):
    engine = live.engine

    async def scenario() -> list[tuple[int, int]]:
        async with live.async_client() as client:
            http_load = [asyncio.create_task(stream_tokens(client, "a", 200)) for _ in range(6)]

            def all_on_the_adapter() -> bool:
                seqs = list(engine.scheduler.queues.sequences.values())
                return sum(seq.lora_slot == 1 for seq in seqs) == 6

            await asyncio.to_thread(wait_until, all_on_the_adapter, 60, "requests on the adapter")
            with live.client() as http:
                info = lora_info(http)
                assert info["running_lora_adapters"] == "a" and info["max_lora"] == "2"
                assert (
                    http.post("/v1/unload_lora_adapter", json={"lora_name": "a"}).status_code == 200
                )
                assert complete(http, "a").status_code == 404
            results = await asyncio.gather(*http_load)
            # Load and unload again and again while base-model requests run.
            base = [asyncio.create_task(stream_tokens(client, MODEL_NAME, 24)) for _ in range(6)]
            body = {"lora_name": "b", "lora_path": str(adapters["b"])}
            for _ in range(4):
                loaded = await client.post("/v1/load_lora_adapter", json=body)
                assert loaded.status_code == 200, loaded.text
                used = await client.post(
                    "/v1/completions",
                    json={"model": "b", "prompt": PROMPT, "max_tokens": 16, "temperature": 0.0,
                          "ignore_eos": True},
                )  # fmt: skip
                assert text_of(used) == expected["b"]
                unloaded = await client.post("/v1/unload_lora_adapter", json={"lora_name": "b"})
                assert unloaded.status_code == 200, unloaded.text
            return results + list(await asyncio.gather(*base))

    results = asyncio.run(scenario())
    assert all(status == 200 for status, _ in results), results
    assert [tokens for _, tokens in results] == [200] * 6 + [24] * 6  # all ran to the end
    with live.client() as http:
        wait_until(lambda: is_idle(http), 60, "the server to be idle")
        assert lora_info(http)["running_lora_adapters"] == ""
    assert not engine.lora.registry.slots  # every slot freed: nothing leaked
    assert engine.memory_stats()["used_blocks"] == 0
    # "a" loads again (as at start) and answers as before.
    with live.client() as http:
        body = {"lora_name": "a", "lora_path": str(adapters["a"])}
        assert http.post("/v1/load_lora_adapter", json=body).status_code == 200
        assert text_of(complete(http, "a")) == expected["a"]


def load_inplace(http: httpx.Client, name: str, path) -> httpx.Response:
    body = {"lora_name": name, "lora_path": str(path), "load_inplace": True}
    return http.post("/v1/load_lora_adapter", json=body)


def test_load_inplace_replaces_only_what_can_be_served(live, adapters, expected, tmp_path):
    """vLLM's load_inplace: a new adapter that cannot be served is a 400 and the one
    loaded under that name stays, answering as before; even with its files broken where
    they lie (an in-place reload's usual case), or its slot held by running requests."""
    engine = live.engine
    files = shutil.copytree(adapters["a"], tmp_path / "c")
    with live.client() as http:
        assert load_inplace(http, "c", files).status_code == 200  # none yet: a plain load
        assert text_of(complete(http, "c")) == expected["a"]
        slots = set(engine.lora.registry.slots)
        assert len(slots) == engine.lora.max_loras, slots  # "a" and "c": no slot free
        (files / "adapter_config.json").write_text("{not json")
        refused = {
            "nowhere": (tmp_path / "nowhere", "adapter_config.json is missing"),
            "broken in place": (files, "adapter_config.json is not JSON"),
            "high": (adapters["high"], "rank 16, above max_lora_rank (8)"),
            "other": (adapters["other"], "does not fit this model"),
        }
        for case, (path, message) in refused.items():
            response = load_inplace(http, "c", path)
            assert response.status_code == 400, (case, response.text)
            assert message in response.json()["error"]["message"], (case, response.text)
            assert listed(http)["c"]["root"] == str(files), case
            assert text_of(complete(http, "c")) == expected["a"], case
        assert set(engine.lora.registry.slots) == slots

    async def while_c_runs() -> list[tuple[int, int]]:
        async with live.async_client() as client:
            running = [asyncio.create_task(stream_tokens(client, "c", 200)) for _ in range(3)]
            slot = engine.lora.resolve("c").slot

            def all_on_c() -> bool:
                seqs = list(engine.scheduler.queues.sequences.values())
                return sum(seq.lora_slot == slot for seq in seqs) == 3

            await asyncio.to_thread(wait_until, all_on_c, 60, "requests on the adapter")
            with live.client() as http:
                # Its slot frees only once they finish, and no other is free.
                busy = load_inplace(http, "c", adapters["b"])
                assert busy.status_code == 400, busy.text
                assert "by requests still running on it" in busy.json()["error"]["message"]
                assert text_of(complete(http, "c")) == expected["a"]
            return list(await asyncio.gather(*running))

    assert asyncio.run(while_c_runs()) == [(200, 200)] * 3
    with live.client() as http:
        wait_until(lambda: is_idle(http), 60, "the server to be idle")
        replaced = load_inplace(http, "c", adapters["b"])
        assert replaced.status_code == 200, replaced.text
        assert listed(http)["c"]["root"] == str(adapters["b"])
        assert text_of(complete(http, "c")) == expected["b"]
        assert http.post("/v1/unload_lora_adapter", json={"lora_name": "c"}).status_code == 200
        wait_until(lambda: is_idle(http), 60, "the server to be idle")
    assert len(engine.lora.registry.slots) == len(slots) - 1  # nothing leaked


def test_lora_routes_without_enable_lora(server):
    with server.client() as http:
        body = {"lora_name": "x", "lora_path": "/nowhere"}
        response = http.post("/v1/load_lora_adapter", json=body)
        assert response.status_code == 400 and "--enable-lora" in response.text
        assert lora_info(http) == {
            "max_lora": "0",
            "running_lora_adapters": "",
            "waiting_lora_adapters": "",
        }


def test_lora_flags():
    argv = ["--enable-lora", "--max-loras", "3", "--max-lora-rank", "32"]
    argv += ["--lora-modules", "a=/adapters/a", '{"name": "b", "path": "/adapters/b"}']
    settings = settings_for(argv, {})
    assert settings.engine.enable_lora and settings.engine.max_loras == 3
    assert settings.engine.max_lora_rank == 32
    assert settings.lora_modules == (("a", "/adapters/a"), ("b", "/adapters/b"))
    env = {"HETERO_ENABLE_LORA": "true", "HETERO_LORA_MODULES": "c=/adapters/c"}
    assert settings_for([], env).lora_modules == (("c", "/adapters/c"),)
    with pytest.raises(ValueError, match="needs --enable-lora"):
        settings_for(["--lora-modules", "a=/x"], {})
    with pytest.raises(ValueError, match="is not name=path"):
        settings_for(["--enable-lora", "--lora-modules", "a"], {})
