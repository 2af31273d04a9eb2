"""Live servers for the end-to-end tests: a real engine on a tiny random Llama.

`start_server()` runs uvicorn in a background thread of this process, so a test can
reach the engine behind it (`server.engine`, `server.state`); `spawn_server()` runs
the installed `hetero-infer serve` as a user does (installed_command), for what needs
signals or the process as a whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from hetero_infer.engine.entrypoints.llm_engine import LLMEngine
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.server.app import ServerState, build_app
from hetero_infer.server.settings import ServerSettings

from tests.ports import free_port, free_socket
from tests.tiny_models import save_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_NAME = "tiny-llama"
# Enough KV blocks for every request of a test in flight at once (block_size 16):
# 50 requests of up to ~400 tokens each is 1,250 blocks; a block of the tiny model is 9 KiB.
MAX_MODEL_LEN = 512
MAX_NUM_BLOCKS = 2048
# Waits are generous: the CI machine is slow and shared. Nothing here asserts speed.
STARTUP_TIMEOUT = 120.0


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def make_engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    values: dict[str, Any] = dict(
        model=str(model_dir), max_model_len=MAX_MODEL_LEN, max_num_blocks=MAX_NUM_BLOCKS
    )
    values.update(overrides)
    return LLMEngine(EngineConfig(**values))


@dataclass
class LiveServer:
    """A uvicorn server running the real app in a background thread."""

    url: str
    engine: LLMEngine
    state: ServerState
    settings: ServerSettings
    _server: uvicorn.Server = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 60.0)
        return httpx.Client(base_url=self.url, **kwargs)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        kwargs.setdefault("timeout", 60.0)
        return httpx.AsyncClient(base_url=self.url, **kwargs)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)
        assert not self._thread.is_alive(), "the server thread did not stop"


def start_server(model_dir: Path, engine: LLMEngine | None = None, **settings: Any) -> LiveServer:
    """Start the app with a real engine on a free port; return once /readyz says 200."""
    engine = engine or make_engine(model_dir)
    sock = free_socket()
    port = sock.getsockname()[1]
    settings.setdefault("served_model_name", MODEL_NAME)
    server_settings = ServerSettings(engine=engine.config, host="127.0.0.1", port=port, **settings)
    app = build_app(server_settings, engine=engine)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name=f"uvicorn-{port}", daemon=True
    )
    thread.start()
    live = LiveServer(
        url=f"http://127.0.0.1:{port}",
        engine=engine,
        state=app.state.server,
        settings=server_settings,
        _server=server,
        _thread=thread,
    )

    def ready() -> bool:
        if not thread.is_alive():
            raise AssertionError("the server thread died while starting")
        try:
            return httpx.get(f"{live.url}/readyz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, STARTUP_TIMEOUT, "/readyz to turn 200", interval=0.05)
    except BaseException:
        live.stop()
        raise
    return live


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def reference_engine(model_dir: Path) -> LLMEngine:
    """An engine of its own, for the expected greedy texts (the server's is busy)."""
    return make_engine(model_dir)


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[LiveServer]:
    """A server with default settings (no API key, no CORS), shared by a module."""
    live = start_server(model_dir)
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    """The official `openai` client on the module's server; no retries, so that a
    failed request fails its test at once."""
    with openai.OpenAI(
        base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60
    ) as client:
        yield client


# ---- a subprocess server, for signals ----


@dataclass
class ServerProcess:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"the server exited with {self.process.returncode}:\n{self.log()}"
                )
            try:
                return httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, timeout, "the server process to be ready", interval=0.1)

    def terminate(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def installed_command() -> list[str]:
    """The console script the package installs, as a user runs it: `hetero-infer`."""
    script = Path(sys.executable).with_name("hetero-infer")
    assert script.is_file(), f"{script} is missing: install the package (make install)"
    return [str(script)]


def user_environment() -> dict[str, str]:
    """The environment a user's shell gives the server: no PYTHONPATH (the tests' own
    view of the checkout stays out), no HETERO_* settings, one OpenMP thread unless
    the tests say otherwise (they share the cores)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("HETERO_")}
    env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
    return env


def spawn_installed(
    args: list[str], log_dir: Path, port: int | None = None, env: dict[str, str] | None = None
) -> ServerProcess:
    """`hetero-infer serve ARGS --host 127.0.0.1 --port PORT` (a free one by default), run
    from ``log_dir``, outside the checkout, as a user starts it."""
    port = port or free_port()
    log_path = log_dir / f"server-{port}.log"
    command = [*installed_command(), "serve", *args, "--host", "127.0.0.1", "--port", str(port)]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=log_dir,
            env=env or user_environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return ServerProcess(f"http://127.0.0.1:{port}", process, log_path)


def spawn_server(model_dir: Path, log_dir: Path, *extra_args: str) -> ServerProcess:
    """The installed server on ``model_dir`` (the caller waits and stops it)."""
    args = [
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-blocks",
        str(MAX_NUM_BLOCKS),
        *extra_args,
    ]
    return spawn_installed(args, log_dir)


@pytest.fixture
def server_process_factory(
    model_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., ServerProcess]]:
    """Spawns subprocess servers; kills any still running at teardown."""
    started: list[ServerProcess] = []

    def spawn(*extra_args: str) -> ServerProcess:
        proc = spawn_server(model_dir, tmp_path, *extra_args)
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        proc.kill()
