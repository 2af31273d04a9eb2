"""Ranks started by torchrun, as users who launch them themselves do: rank 0 runs the
engine (here the one-shot command line) and the other ranks serve it, giving what one
process gives; every rank exits 0 once rank 0 is done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams

from tests.ports import free_port
from tests.server.conftest import REPO_ROOT
from tests.tiny_models import save_tiny_model

PROMPT = "Hello there"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)  # the command line's default


def test_torchrun_ranks_give_one_process_text(tmp_path: Path):
    folder = save_tiny_model("qwen2", tmp_path / "qwen2")
    # A small KV cache: the default budget (2 GiB) takes seconds to allocate on each rank.
    config = EngineConfig(model=str(folder), dtype="float32", max_num_blocks=16, max_model_len=64)
    expected = LLMEngine(config).generate(PROMPT, GREEDY, use_tqdm=False)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        "-m",
        "hetero_infer.server.cli",
        f"--model={folder}",
        f"--input={PROMPT}",
        "--max-tokens=12",
        "--dtype=float32",
        "--max-num-blocks=16",
        "--max-model-len=64",
        "--tensor-parallel-size=2",
        "--json",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_")}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["text"] == expected[0].text
    assert result["completion_tokens"] == len(expected[0].token_ids) == 12
