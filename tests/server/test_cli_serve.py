"""What `hetero-infer serve` starts (server/cli.py's serve_main): the server with its
settings on a socket bound before the model loads; a port in use or a bad setting ends
it at once, saying why; another node's or torchrun rank's process runs its ranks only.
The server itself is replaced here: the real one is started by tests/server/conftest.py
and test_installed_server.py, and the other nodes by tests/engine/executor/test_nodes.py.
"""

from __future__ import annotations

import errno
import os
import socket

import pytest
from hetero_infer.server import cli, serve

from tests.ports import free_port
from tests.server.command_recorders import record_other_node, under_torchrun


@pytest.fixture
def started(monkeypatch):
    """What serve_main gave the server and the process settings, in order."""
    calls: list[tuple] = []
    monkeypatch.setattr(cli, "apply_process_settings", lambda config: calls.append(("process",)))

    def fake_serve(settings, listener):
        calls.append(("serve", settings, listener.getsockname()))
        listener.close()
        return 3

    monkeypatch.setattr(serve, "serve", fake_serve)
    return calls


def test_the_server_gets_its_settings_and_a_bound_socket(started):
    port = free_port()
    assert cli.main(["serve", "--port", str(port), "--max-num-seqs", "3"]) == 3
    process, (_, settings, address) = started
    assert process == ("process",)  # the process set up for the engine first
    assert address == ("127.0.0.1", port) and settings.port == port
    assert settings.engine.max_num_seqs == 3


def test_a_port_in_use_ends_it_saying_so(started, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["serve", "--port", str(port)]) == 1
    reason = os.strerror(errno.EADDRINUSE)
    assert capsys.readouterr().err == f"error: cannot listen on 127.0.0.1:{port}: {reason}\n"
    assert started == []


def test_a_bad_setting_ends_it_before_it_listens(started, capsys):
    assert cli.main(["serve", "--port", "70000"]) == 2
    assert capsys.readouterr().err == "error: port must be in 1..65535, got 70000\n"
    assert started == []


def test_another_nodes_process_runs_its_ranks_only(started, monkeypatch):
    ran = record_other_node(monkeypatch, returns=5)
    argv = ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"]
    argv += ["--dist-init-addr", "127.0.0.1:29500", "--shutdown-timeout", "7"]
    assert cli.main(["serve", *argv]) == 5
    assert ran == [(1, 7.0)] and started == []  # it drains as long as the server


@pytest.mark.parametrize("rank", [0, 1])
def test_under_torchrun_rank_0_serves_and_the_others_run_their_rank(rank, started, monkeypatch):
    ranks = []
    monkeypatch.setattr(cli, "run_torchrun_worker", lambda config: ranks.append(config) or 6)
    under_torchrun(monkeypatch, rank)
    port = free_port()
    code = cli.main(["serve", "--tensor-parallel-size", "2", "--port", str(port)])
    if rank == 0:  # the server's engine joins torchrun's ranks
        assert code == 3 and ranks == []
        assert started[1][1].engine.distributed_executor_backend == "external_launcher"
    else:
        assert code == 6 and started == []
        assert ranks[0].distributed_executor_backend == "external_launcher"
