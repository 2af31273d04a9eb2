"""`hetero-infer serve` with no model: the embedded SmolLM2 answers over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys

import openai
import pytest

from tests.server.conftest import REPO_ROOT, ServerProcess, free_port

pytestmark = pytest.mark.slow


# Answered "Paris" in bf16 and fp32 alike, each token ahead by over 1.6 nats: no near-tie.
QUESTION = "What is the capital of France? Answer with one word."


def test_default_model_answers_through_the_sdk(tmp_path):
    port = free_port()
    log_path = tmp_path / "hetero_infer.server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_")}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "hetero_infer.server.cli", "serve", "--port", str(port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
    try:
        server.wait_ready(timeout=300)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", timeout=120)
        # The model's own name first (the one reported), and the project's.
        names = [m.id for m in client.models.list().data]
        assert names == ["SmolLM2-135M-Instruct", "hetero-infer"]
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=30,
            temperature=0,
        )
        assert "Paris" in reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop"
        server.terminate()
        assert process.wait(timeout=60) == 0
    finally:
        server.kill()
    log = log_path.read_text(errors="replace")
    assert "KV cache:" in log and "max concurrency" in log
    # The CPU kernels came with the install: the first start compiles nothing.
    assert "CPU kernels ready" in log and "compiling the CPU kernels" not in log
