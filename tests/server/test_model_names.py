"""The names a server answers to: the model's own and "hetero-infer" by default (the seed
README's request), or every name given to --served-model-name, the first reported."""

from __future__ import annotations

import pytest

from tests.server.conftest import start_server
from tests.server.test_openai_api import check_model_card


@pytest.fixture(scope="module")
def default_names_server(model_dir):
    live = start_server(model_dir, served_model_name=())
    yield live
    live.stop()


def test_the_seed_readme_request(default_names_server):
    with default_names_server.client() as client:
        response = client.post(
            "/v1/completions", json={"model": "hetero-infer", "prompt": "hello", "max_tokens": 8}
        )
        assert response.status_code == 200, response.text
        body = response.json()
        own_name = default_names_server.settings.model_name
        assert body["model"] == own_name == default_names_server.settings.model_names[0]
        assert body["usage"]["completion_tokens"] >= 1
        listed = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert listed == [own_name, "hetero-infer"]
        chat = client.post(
            "/v1/chat/completions",
            json={"model": own_name, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert chat.status_code == 200, chat.text
        missing = client.post("/v1/completions", json={"model": "other", "prompt": "hello"})
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "model_not_found"


def test_several_served_names(model_dir):
    # A hub id's slash in a name: /v1/models/{model} takes it whole.
    live = start_server(model_dir, served_model_name=("first", "org/second"))
    try:
        with live.client() as client:
            for name in ("first", "org/second"):
                response = client.post(
                    "/v1/completions", json={"model": name, "prompt": "hello", "max_tokens": 2}
                )
                assert response.status_code == 200 and response.json()["model"] == "first"
            cards = client.get("/v1/models").json()["data"]
            assert [card["id"] for card in cards] == ["first", "org/second"]
            for card in cards:  # every name a card for the one model
                check_model_card(card, card["id"], str(model_dir))
                assert card["max_model_len"] == live.engine.max_model_len
                retrieved = client.get(f"/v1/models/{card['id']}").json()
                check_model_card(retrieved, card["id"], str(model_dir))
            assert client.get("/v1/models/org").status_code == 404
            response = client.post("/v1/completions", json={"model": "hetero-infer", "prompt": "x"})
            assert response.status_code == 404
    finally:
        live.stop()
