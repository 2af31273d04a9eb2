"""The chat page at / in headless Chromium, against live servers on a tiny model.

The tiny model's answers are gibberish; what is checked is the page: streaming as
tokens arrive, stop (and the server freeing the request), the API key, errors in
words, the conversation, the live metrics panel, keyboard use, a narrow window.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx

from tests.server.conftest import MODEL_NAME, LiveServer, wait_until
from tests.ui.conftest import API_KEY

CHAT_PATH = "/v1/chat/completions"

# Records, on every change under #messages, how long the last answer's text is.
RECORD_UPDATES = """() => {
  window.__updates = [];
  const log = document.getElementById("messages");
  new MutationObserver(() => {
    const answers = log.querySelectorAll(".msg.assistant .content");
    const last = answers[answers.length - 1];
    if (last) window.__updates.push(last.textContent.length);
  }).observe(log, { childList: true, subtree: true, characterData: true });
}"""


def open_chat(page: Any, server: LiveServer) -> list[dict[str, Any]]:
    """Load the page; return the list that collects each chat request's JSON body."""
    bodies: list[dict[str, Any]] = []

    def on_request(request: Any) -> None:
        if request.url.endswith(CHAT_PATH):
            bodies.append({"json": request.post_data_json, "headers": request.headers})

    page.on("request", on_request)
    page.goto(server.url + "/")
    return bodies


def set_controls(page: Any, **values: str) -> None:
    for field, value in values.items():
        page.fill(f"#{field.replace('_', '-')}", value)


def send(page: Any, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def last_answer(page: Any) -> Any:
    return page.locator(".msg.assistant").last


def wait_answer(page: Any, state: str = "done") -> str:
    answer = last_answer(page)
    answer.and_(page.locator(f"[data-state={state}]")).wait_for()
    return answer.locator(".content").text_content()


def metric(server: LiveServer, name: str) -> float:
    """A series' value from /metrics, summed over its labels."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert values, f"{name} not in /metrics"
    return sum(float(v) for v in values)


def num_running(server: LiveServer) -> int:
    return len(server.engine.scheduler.queues.running)


def test_page_and_assets_are_served_without_the_key(keyed_server: LiveServer):
    with keyed_server.client() as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for asset, kind in [("/static/chat.css", "text/css"), ("/static/chat.js", "javascript")]:
            assert asset in page.text
            response = http.get(asset)
            assert response.status_code == 200 and kind in response.headers["content-type"]
            assert "http://" not in response.text and "https://" not in response.text
        assert http.get("/static/../app.py").status_code in (401, 404)
        assert http.get("/v1/models").status_code == 401


def test_streams_an_answer_token_by_token(page: Any, ui_server: LiveServer, output_dir: Path):
    bodies = open_chat(page, ui_server)
    page.locator("#model-name", has_text=MODEL_NAME).wait_for()
    set_controls(page, system_prompt="Answer briefly.", temperature="0", top_p="1", max_tokens="40")
    page.evaluate(RECORD_UPDATES)
    # Keyboard only: Shift+Enter is a newline, Enter sends.
    page.focus("#prompt")
    page.keyboard.type("Hello")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("world")
    page.keyboard.press("Enter")

    text = wait_answer(page)
    assert page.locator(".msg.user .content").text_content() == "Hello\nworld"
    lengths = [n for n in page.evaluate("window.__updates") if n > 0]
    print(f"{len(set(lengths))} DOM updates of the answer")
    # The text grew in many steps, not in one piece at the end.
    assert len(set(lengths)) > 5, lengths
    assert lengths == sorted(lengths) and lengths[-1] == len(text)

    # The panel was refreshed as the answer ended. The screenshot is for a person to look at.
    page.locator("#m-running", has_text=re.compile(r"^0$")).wait_for()
    page.screenshot(path=str(output_dir / "chat.png"))
    print(f"screenshot: {output_dir / 'chat.png'}")

    body = bodies[-1]["json"]
    assert body["stream"] is True
    assert body["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hello\nworld"},
    ]
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0, 1, 40)
    assert body["model"] == MODEL_NAME
    # What the page shows is the server's answer: the same request, not streamed (greedy;
    # without the stream's options, which need a stream).
    whole = {**body, "stream": False, "stream_options": None}
    with ui_server.client() as http:
        expected = http.post(CHAT_PATH, json=whole).json()
    assert text == expected["choices"][0]["message"]["content"]
    assert "40 tokens" in last_answer(page).locator(".meta").text_content()


def test_conversation_is_kept_and_new_chat_clears_it(page: Any, ui_server: LiveServer):
    bodies = open_chat(page, ui_server)
    set_controls(page, temperature="0", max_tokens="6")
    send(page, "first")
    first = wait_answer(page)
    send(page, "second")
    wait_answer(page)
    assert page.locator(".msg.assistant[data-state=done]").count() == 2
    assert bodies[-1]["json"]["messages"] == [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "second"},
    ]

    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    assert page.locator("#empty-hint").is_visible()
    # New chat in the middle of an answer drops it too (and the answer's request).
    set_controls(page, max_tokens="400")
    send(page, "long")
    last_answer(page).and_(page.locator("[data-state=streaming]")).wait_for()
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0
    wait_until(lambda: ui_server.state.engine.num_pending == 0, 5, "the answer's abort")
    set_controls(page, max_tokens="6")
    send(page, "third")
    wait_answer(page)
    assert bodies[-1]["json"]["messages"] == [{"role": "user", "content": "third"}]


def test_stop_aborts_the_request_on_the_server(page: Any, ui_server: LiveServer):
    open_chat(page, ui_server)
    generated_before = metric(ui_server, "vllm:generation_tokens_total")
    # Greedy, this prompt runs to max tokens: 400 tokens take 10 s or more here.
    set_controls(page, temperature="0", max_tokens="400")
    send(page, "Tell me a long story.")
    wait_until(lambda: num_running(ui_server) == 1, 10, "the request to run")
    last_answer(page).and_(page.locator("[data-state=streaming]")).wait_for()
    # The live panel sees it: one running, tokens flowing.
    page.locator("#m-running", has_text=re.compile(r"^1$")).wait_for()
    wait_until(lambda: float(page.text_content("#m-tps") or "0") > 0, 10, "a tokens/s reading")
    assert page.is_enabled("#stop") and page.is_disabled("#send")

    page.click("#stop")
    wait_answer(page, state="stopped")
    wait_until(lambda: num_running(ui_server) == 0, 5, "the server to drop the request")
    wait_until(lambda: ui_server.state.engine.num_pending == 0, 5, "no pending requests")
    assert metric(ui_server, "vllm:num_requests_running") == 0
    assert ui_server.engine.memory_stats()["num_running"] == 0
    page.locator("#m-running", has_text=re.compile(r"^0$")).wait_for()
    # It was stopped mid-answer, not run to the end.
    assert metric(ui_server, "vllm:generation_tokens_total") - generated_before < 400
    assert "stopped" in last_answer(page).locator(".meta").text_content()
    assert page.is_enabled("#send") and page.is_disabled("#stop")
    assert page.locator("[role=alert]").count() == 0


def test_api_key_is_sent_and_a_bad_key_is_shown(page: Any, keyed_server: LiveServer):
    bodies = open_chat(page, keyed_server)
    page.locator("#model-name", has_text="API key").wait_for()
    set_controls(page, max_tokens="8")

    send(page, "hi")  # no key
    alert = page.locator(".msg.error[role=alert]").last
    alert.wait_for()
    assert "401" in alert.text_content()
    assert "invalid or missing API key" in alert.text_content()
    # The failed turn is taken back, its text left in the box to send again.
    assert page.locator(".msg.user").count() == 0
    assert page.input_value("#prompt") == "hi"

    page.fill("#api-key", "not-the-key")
    page.press("#prompt", "Enter")
    wait_until(lambda: page.locator(".msg.error").count() == 2, 10, "the second error")
    assert bodies[-1]["headers"]["authorization"] == "Bearer not-the-key"

    page.fill("#api-key", API_KEY)
    page.dispatch_event("#api-key", "change")
    page.locator("#model-name", has_text=MODEL_NAME).wait_for()
    page.press("#prompt", "Enter")
    assert wait_answer(page)
    assert bodies[-1]["headers"]["authorization"] == f"Bearer {API_KEY}"
    assert page.locator(".msg.error").count() == 2
    assert keyed_server.state.engine.num_pending == 0


def test_a_rejected_request_is_explained(page: Any, ui_server: LiveServer):
    open_chat(page, ui_server)
    set_controls(page, temperature="5")
    send(page, "hi")
    alert = page.locator(".msg.error[role=alert]")
    alert.wait_for()
    assert "Error 400" in alert.text_content()
    assert "temperature" in alert.text_content()


def test_narrow_window_labels_and_no_outside_requests(
    page: Any, ui_server: LiveServer, output_dir: Path
):
    page.set_viewport_size({"width": 360, "height": 740})
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    open_chat(page, ui_server)
    # Every control has a label a screen reader can read.
    unlabeled = page.evaluate(
        """() => [...document.querySelectorAll("input, textarea, select")]
              .filter((e) => e.labels.length === 0).map((e) => e.id)"""
    )
    assert unlabeled == []
    # Nothing wider than the window.
    assert page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    # The settings fold away on a narrow window, so the chat comes first.
    assert page.evaluate("document.activeElement.id") == "prompt"
    assert not page.is_visible("#max-tokens")
    page.click("#settings summary")
    set_controls(page, max_tokens="12")
    page.click("#settings summary")
    # Type and Enter, no mouse.
    page.focus("#prompt")
    page.keyboard.type("Hi from a phone")
    page.keyboard.press("Enter")
    wait_answer(page)
    assert page.evaluate(
        "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
    )
    page.screenshot(path=str(output_dir / "chat-narrow.png"), full_page=True)
    # The page reached no one but this server.
    outside = [u for u in urls if not u.startswith(ui_server.url) and not u.startswith("data:")]
    assert outside == []
