"""Stand-ins that record what the `hetero-infer` commands hand on (tests/server/
test_cli_serve.py, test_cli_one_shot.py, test_tune.py): the process set-up, the engine's
shutdown, another node's run, and torchrun's variables for a rank."""

from __future__ import annotations

from types import ModuleType

import pytest
from hetero_infer.engine import LLMEngine
from hetero_infer.server import cli


def record_set_up_and_shutdown(monkeypatch: pytest.MonkeyPatch, command: ModuleType) -> list:
    """``command``'s apply_process_settings and every engine's shutdown (which still
    runs), as "process" and "shutdown" in the list, in order."""
    calls: list = []
    monkeypatch.setattr(command, "apply_process_settings", lambda config: calls.append("process"))
    shutdown = LLMEngine.shutdown
    monkeypatch.setattr(
        LLMEngine, "shutdown", lambda self: calls.append("shutdown") or shutdown(self)
    )
    return calls


def record_other_node(monkeypatch: pytest.MonkeyPatch, returns: int) -> list:
    """cli's run_other_node: (node rank, drain seconds) of each call; it returns ``returns``."""
    ran: list = []
    monkeypatch.setattr(cli, "run_other_node", lambda config, drain_seconds: ran.append(
        (config.node_rank, drain_seconds)) or returns)  # fmt: skip
    return ran


def under_torchrun(monkeypatch: pytest.MonkeyPatch, rank: int) -> None:
    """torchrun's variables for ``rank`` of two."""
    torchrun = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    for name, value in {**torchrun, "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(name, value)
