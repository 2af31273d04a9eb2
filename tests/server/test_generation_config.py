"""The model's generation_config.json gives the defaults of what a request leaves out,
against live servers with the real engine on a tiny Llama folder that has one; and the
mapping itself, on the request bodies."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator

import pytest
from hetero_infer.server.openai.chat_request import ChatCompletionRequest
from hetero_infer.server.openai.completion_request import CompletionRequest

from tests.server.conftest import MAX_MODEL_LEN, LiveServer, make_engine, start_server

# Greedy, so that answers compare exactly, with a repetition penalty strong enough to
# change them.
GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.0,
    "repetition_penalty": 100.0,
    "max_new_tokens": 5,
}
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def folder(model_dir, tmp_path_factory):
    """The tiny Llama, with the generation_config.json its makers might have written."""
    copy = shutil.copytree(model_dir, tmp_path_factory.mktemp("with-defaults") / "llama")
    (copy / "generation_config.json").write_text(json.dumps(GENERATION_CONFIG))
    return copy


@pytest.fixture(scope="module")
def defaults_server(folder) -> Iterator[LiveServer]:
    live = start_server(folder, make_engine(folder))
    yield live
    live.stop()


def test_a_request_without_max_tokens_gets_the_models(defaults_server: LiveServer):
    with defaults_server.client() as http:
        chat = http.post("/v1/chat/completions", json={"messages": MESSAGES, "ignore_eos": True})
        assert chat.json()["usage"]["completion_tokens"] == 5
        # Completions too: the model's default goes over OpenAI's 16.
        body = {"prompt": [5, 6, 7], "ignore_eos": True}
        assert http.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 5
        # A request's own value wins.
        answer = http.post("/v1/completions", json={**body, "max_tokens": 7}).json()
        assert answer["usage"]["completion_tokens"] == 7


def test_each_prompt_gets_the_models_max_tokens_within_its_own_room(defaults_server):
    """Without max_tokens, each prompt of a completion gets the model's default where its
    context has room, else the room; min_tokens must fit the least of them."""
    long_prompt = [5] * (MAX_MODEL_LEN - 3)  # room for 3 tokens, short of the default 5
    body = {"prompt": [long_prompt, [5, 6, 7]], "ignore_eos": True}
    with defaults_server.client() as http:
        answer = http.post("/v1/completions", json=body).json()
        assert answer["usage"]["completion_tokens"] == 3 + 5
        refused = http.post("/v1/completions", json={**body, "min_tokens": 4})
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "min_tokens"
        # A beam search's too (as vLLM's, each prompt's search to its own limit); the
        # model's repetition penalty is a sampling value, which a search does not use.
        beams = http.post("/v1/completions", json={**body, "use_beam_search": True, "n": 2})
        assert beams.status_code == 200, beams.text
        assert beams.json()["usage"]["completion_tokens"] == 2 * 3 + 2 * 5


def test_the_models_sampling_values_apply_where_the_request_gives_none(
    defaults_server: LiveServer,
):
    body = {"prompt": [5, 6, 7, 5, 6, 7], "max_tokens": 5}

    def text(**fields) -> str:
        with defaults_server.client() as http:
            answer = http.post("/v1/completions", json={**body, **fields}).json()
        return answer["choices"][0]["text"]

    penalized, unpenalized = text(repetition_penalty=100.0), text(repetition_penalty=1.0)
    assert penalized != unpenalized  # the penalty shows in the answer
    assert text() == penalized  # the model's default applies
    assert text(temperature=0) == penalized  # greedy: the model's temperature 0 applies too


def test_the_override_goes_over_the_file_and_the_context_caps_it(folder, tmp_path):
    engine = make_engine(folder, override_generation_config={"max_new_tokens": 1000})
    live = start_server(folder, engine)
    try:
        prompt = [5] * (MAX_MODEL_LEN - 7)  # room for 7 tokens: more than 5, less than 1000
        with live.client() as http:
            answer = http.post("/v1/completions", json={"prompt": prompt, "ignore_eos": True})
            assert answer.status_code == 200
            assert answer.json()["usage"]["completion_tokens"] == 7
            # Asked for by the request, the same is OpenAI's context error.
            asked = http.post(
                "/v1/completions", json={"prompt": prompt, "max_tokens": 1000, "ignore_eos": True}
            )
            assert asked.status_code == 400
    finally:
        live.stop()


# ---- the bodies' mapping ----

DEFAULTS = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.1}


def test_defaults_fill_what_the_body_leaves_out():
    body = ChatCompletionRequest(messages=MESSAGES, top_p=0.5, temperature=0)
    params = body.sampling_params(16, DEFAULTS)
    assert params.temperature == 0 and params.top_p == 0.5  # the body's own win
    assert params.top_k == 20 and params.repetition_penalty == 1.1
    params = CompletionRequest(prompt="x").sampling_params(16)
    assert (params.temperature, params.top_k) == (1.0, -1)  # none: the built-in ones
