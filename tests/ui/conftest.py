"""The chat page (server/static/) driven in headless Chromium against live servers.

Chromium is Debian's package (`apt-get install -y chromium`, which .ci/run does), run
by Playwright's Python package; Playwright's own browser download is not used. A
missing browser fails these tests, with the command that installs it: CI has it, so
a skip would only hide a broken set-up.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import REPO_ROOT, LiveServer, make_engine, start_server
from tests.tiny_models import save_tiny_model

# Screenshots land here, for a person to look at (tests/ui/.gitignore keeps them out of git).
OUTPUT_DIR = Path(os.environ.get("HETERO_UI_OUTPUT", REPO_ROOT / "tests" / "ui" / "output"))
API_KEY = "ui-test-key"
# Headless, and quiet: without the networking flags Chromium keeps calling Google's
# services, which on a closed network floods it with retries.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-quic",
]
# Each engine step sleeps this long: a 1 ms step would put many tokens in one network
# read, and the tests want to watch them arrive one by one (and stop mid-answer).
STEP_DELAY_S = 0.025


def chromium_path() -> str:
    """Debian's chromium, or HETERO_CHROMIUM; fails (never skips) when there is none."""
    candidates = [os.environ.get("HETERO_CHROMIUM"), "/usr/bin/chromium"]
    candidates += [shutil.which(name) for name in ("chromium", "chromium-browser")]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail(
        "the chat page tests need Chromium, and none was found: install it with "
        "`apt-get update && apt-get install -y chromium` (Debian/Ubuntu; .ci/run does this), "
        "or point HETERO_CHROMIUM at a Chromium or Chrome binary",
        pytrace=False,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per module; each test gets a context of its own.

    Not per session: Playwright's sync API keeps an event loop running in the main
    thread while it is open, and tests elsewhere call asyncio.run().
    """
    executable = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(
            "the chat page tests need Playwright's Python package: pip install -e '.[dev]'",
            pytrace=False,
        )
    with sync_playwright() as playwright:
        # Playwright starts Chromium with a fresh, temporary --user-data-dir of its own.
        browser = playwright.chromium.launch(
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page (own storage) that fails the test on any uncaught script error."""
    context = browser.new_context(viewport={"width": 1200, "height": 800})
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    yield page
    context.close()
    assert not errors, f"script errors on the page: {errors}"


@pytest.fixture(scope="session")
def ui_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("ui-tiny-llama"))


def _slowed_server(model_dir: Path, **settings: Any) -> LiveServer:
    engine = make_engine(model_dir)
    step = engine.step

    def slow_step():  # runs on the engine's step thread, never on the event loop
        time.sleep(STEP_DELAY_S)
        return step()

    engine.step = slow_step
    return start_server(model_dir, engine=engine, **settings)


@pytest.fixture(scope="module")
def ui_server(ui_model_dir: Path) -> Iterator[LiveServer]:
    """No API key."""
    live = _slowed_server(ui_model_dir)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def keyed_server(ui_model_dir: Path) -> Iterator[LiveServer]:
    """Needs API_KEY."""
    live = _slowed_server(ui_model_dir, api_key=API_KEY)
    yield live
    live.stop()


@pytest.fixture(scope="session")
def output_dir() -> Path:
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUTPUT_DIR
