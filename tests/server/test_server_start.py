"""A server that cannot start says why and exits, as `hetero-infer serve` is run by a user
or a supervisor: status 1 and a one-line ``error:`` as the last thing it prints, rather
than a server that never turns ready. What can be known before the socket listens (the
port, the model's files, its architecture, the memory asked for) is checked first."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import save_file

from tests.server.conftest import (
    ServerProcess,
    installed_command,
    spawn_installed,
    user_environment,
    wait_until,
)

# Every failure here comes before or right after the model's load: well under this.
EXIT_TIMEOUT = 120.0


def exits_with_error(process: ServerProcess) -> str:
    """The server's last line, once it has exited with status 1."""
    try:
        status = process.process.wait(timeout=EXIT_TIMEOUT)
    finally:
        process.kill()
    lines = process.log().strip().splitlines()
    assert status == 1, process.log()
    assert lines and lines[-1].startswith("error: "), process.log()
    return lines[-1]


def test_a_port_in_use_ends_it_before_anything_loads(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        line = exits_with_error(spawn_installed([], tmp_path, port=port))
    assert line == f"error: cannot listen on 127.0.0.1:{port}: Address already in use"
    # Nothing was loaded (the model's config is the first thing the engine reads).
    assert "config LlamaForCausalLM" not in (tmp_path / f"server-{port}.log").read_text()
    assert time.monotonic() - started < 30


def unsupported_model(folder: Path) -> Path:
    """A LLaVA-shaped folder: an architecture the engine does not serve. Its config
    is what transformers saves, less the defaults it fills in again when loaded."""
    folder.mkdir()
    config = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"weight": torch.zeros(1)}, folder / "model.safetensors")
    return folder


def test_a_model_it_does_not_serve(tmp_path: Path):
    model = unsupported_model(tmp_path / "llava")
    process = spawn_installed(["--model", str(model)], tmp_path)
    line = exits_with_error(process)
    assert "unsupported model architecture LlavaForConditionalGeneration" in line
    assert "listening on" not in process.log()  # known before the socket listened


def test_a_model_path_that_does_not_exist(tmp_path: Path):
    missing = tmp_path / "no-such-model"
    process = spawn_installed(["--model", str(missing)], tmp_path)
    assert exits_with_error(process) == f"error: model {str(missing)!r}: no such file or folder"
    assert "listening on" not in process.log()


def test_a_misspelled_packaged_model(tmp_path: Path):
    env = {**user_environment(), "HF_HUB_OFFLINE": "1"}  # the hub is asked for it too
    process = spawn_installed(["--model", "gemma-3-270M"], tmp_path, env=env)
    line = exits_with_error(process)
    assert "did you mean 'gemma-3-270m'?" in line
    assert "listening on" not in process.log()


def test_a_kv_cache_larger_than_the_memory(tmp_path: Path):
    process = spawn_installed(["--kv-cache-memory", str(2**50)], tmp_path)
    line = exits_with_error(process)
    assert "kv_cache_memory (1048576.0 GiB)" in line and "lower --kv-cache-memory" in line
    assert "listening on" not in process.log()


def test_weights_that_fail_to_load_after_it_listens(tmp_path: Path, model_dir: Path):
    """A folder whose config is sound and whose weights are not: known only while
    loading, after the socket listens, and the process still ends, saying why."""
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in model_dir.iterdir():
        if path.suffix != ".safetensors":
            (broken / path.name).write_bytes(path.read_bytes())
    save_file({"model.embed_tokens.weight": torch.zeros(1)}, broken / "model.safetensors")
    process = spawn_installed(["--model", str(broken)], tmp_path)

    def answered() -> bool:
        try:
            return httpx.get(f"{process.url}/healthz", timeout=5).status_code > 0
        except httpx.TransportError:
            return process.process.poll() is not None  # it may also fail before we ask

    wait_until(answered, EXIT_TIMEOUT, "the server to listen or exit")
    line = exits_with_error(process)
    assert line.startswith("error: ") and "embed_tokens" in line, line
    assert "listening on" in process.log()


def test_bad_settings_exit_with_usage_status(tmp_path: Path):
    """A flag's value the settings refuse: status 2, as argparse's own errors."""
    result = subprocess.run(
        [*installed_command(), "serve", "--port", "70000"], cwd=tmp_path, env=user_environment(),
        capture_output=True, text=True, timeout=EXIT_TIMEOUT,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "error: port must be in 1..65535, got 70000"
