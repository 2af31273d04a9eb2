"""POST /reset_prefix_cache on a live server with a real engine: the cached blocks are
gone after it (the same prompt again finds none), and while a request holds blocks the
reset is refused with a 409 in OpenAI's error shape and changes nothing."""

from __future__ import annotations

import threading

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, make_engine, start_server, wait_until
from tests.tiny_models import save_tiny_model

PROMPT = "The prefix cache keeps this sentence's blocks for the next request. " * 2


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    # Room for a request long enough (seconds) to be running when the reset comes.
    folder = save_tiny_model(
        "llama", tmp_path_factory.mktemp("llama"), max_position_embeddings=4096
    )
    server = start_server(folder, make_engine(folder, max_model_len=4096))
    yield server
    server.stop()


def complete(url: str, max_tokens: int = 2) -> httpx.Response:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}
    response = httpx.post(f"{url}/v1/completions", json={**body, "ignore_eos": True}, timeout=120)
    assert response.status_code == 200, response.text
    return response


def prefix_hits(live) -> int:
    return live.engine.memory_stats()["prefix_cache_hits"]


def test_a_reset_forgets_every_cached_block(live):
    complete(live.url)
    assert live.engine.memory_stats()["cached_blocks"] > 0
    hits = prefix_hits(live)
    complete(live.url)
    assert prefix_hits(live) > hits  # the same prompt found its blocks

    response = httpx.post(f"{live.url}/reset_prefix_cache", timeout=60)
    assert response.status_code == 200
    assert live.engine.memory_stats()["cached_blocks"] == 0
    hits = prefix_hits(live)
    complete(live.url)
    assert prefix_hits(live) == hits  # nothing left to find


def test_no_reset_while_a_request_holds_blocks(live):
    done = threading.Event()
    thread = threading.Thread(target=lambda: (complete(live.url, max_tokens=2000), done.set()))
    thread.start()
    try:
        wait_until(lambda: live.engine.memory_stats()["used_blocks"] > 0, 60, "a running request")
        response = httpx.post(f"{live.url}/reset_prefix_cache", timeout=60)
        assert not done.is_set()  # it ran through the reset
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "prefix_cache_in_use" and "retry" in error["message"]
        assert live.engine.memory_stats()["cached_blocks"] > 0
    finally:
        thread.join(timeout=120)
    assert httpx.post(f"{live.url}/reset_prefix_cache", timeout=60).status_code == 200
