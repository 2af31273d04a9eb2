"""The node settings of tensor parallelism over several machines, as SGLang's flags
(--nnodes, --node-rank, --dist-init-addr), their defaults from LeaderWorkerSet's
variables, and the errors a bad combination gets: `error: ...` and exit status 2, as
every other bad setting. The nodes running together: tests/engine/executor/test_nodes.py."""

from __future__ import annotations

import pytest
from hetero_infer.engine.distributed.rendezvous import Rendezvous, node_ranks
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.dist_init_addr import DEFAULT_PORT, split_init_addr
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.server import cli
from hetero_infer.server.launchers import lws_settings

from tests.server.test_cli import settings_for

# What LeaderWorkerSet sets in the containers of a group's second pod.
LWS_WORKER = {
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "1",
    "LWS_LEADER_ADDRESS": "hetero-infer-0.hetero-infer.default",
}


def test_one_node_by_default():
    engine = settings_for(["--tensor-parallel-size", "2"], {}).engine
    assert (engine.nnodes, engine.node_rank, engine.dist_init_addr) == (1, 0, None)


def test_flags():
    argv = ["--tensor-parallel-size", "4", "--nnodes", "2", "--node-rank", "1"]
    engine = settings_for([*argv, "--dist-init-addr", "10.0.0.5:1234"], {}).engine
    assert (engine.nnodes, engine.node_rank, engine.dist_init_addr) == (2, 1, "10.0.0.5:1234")


def test_leaderworkerset_variables_are_the_defaults():
    engine = settings_for(["--tensor-parallel-size", "2"], LWS_WORKER).engine
    assert engine.nnodes == 2 and engine.node_rank == 1
    assert engine.dist_init_addr == f"hetero-infer-0.hetero-infer.default:{DEFAULT_PORT}"
    leader = settings_for(["--tensor-parallel-size", "2"], {**LWS_WORKER, "LWS_WORKER_INDEX": "0"})
    assert leader.engine.node_rank == 0
    # A group of one pod: one node, as without LeaderWorkerSet.
    single = {"LWS_GROUP_SIZE": "1", "LWS_WORKER_INDEX": "0", "LWS_LEADER_ADDRESS": "x-0.x"}
    assert settings_for([], single).engine.nnodes == 1


def test_flags_and_hetero_variables_win_over_leaderworkerset():
    argv = ["--tensor-parallel-size", "4", "--node-rank", "0", "--dist-init-addr", "10.0.0.5"]
    engine = settings_for(argv, LWS_WORKER).engine
    assert engine.nnodes == 2  # LWS_GROUP_SIZE, given no flag
    assert engine.node_rank == 0 and engine.dist_init_addr == "10.0.0.5"
    env = {**LWS_WORKER, "HETERO_NNODES": "4", "HETERO_NODE_RANK": "3"}
    engine = settings_for(["--tensor-parallel-size", "4"], env).engine
    assert (engine.nnodes, engine.node_rank) == (4, 3)


def test_torchrun_inside_a_leaderworkerset_pod_ignores_its_variables():
    """torchrun places its ranks over the pods itself (its own --nnodes)."""
    torchrun = {**LWS_WORKER, "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.5"}
    assert lws_settings(torchrun) == {}
    assert settings_for(["--tensor-parallel-size", "2"], torchrun).engine.nnodes == 1


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (
            ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "2"],
            {"LWS_LEADER_ADDRESS": "leader"},
            "node_rank must be in 0..1 (nnodes 2), got 2",
        ),
        (
            ["--tensor-parallel-size", "3", "--nnodes", "2", "--dist-init-addr", "leader"],
            {},
            "tensor_parallel_size (3) must be a multiple of nnodes (2)",
        ),
        (
            ["--nnodes", "2", "--dist-init-addr", "leader"],
            {},
            "tensor_parallel_size (1) must be a multiple of nnodes (2)",
        ),
        (
            ["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"],
            {},
            "nnodes 2 needs dist_init_addr",
        ),
        (
            ["--tensor-parallel-size", "2", "--nnodes", "2", "--dist-init-addr", "leader:0"],
            {},
            "dist_init_addr's port must be in 1..65535, got 'leader:0'",
        ),
        (["--nnodes", "0"], {}, "nnodes must be an integer >= 1, got 0"),
        (["--node-rank", "-1"], {}, "node_rank must be an integer >= 0, got -1"),
        (["--tensor-parallel-size", "2"], {**LWS_WORKER, "LWS_GROUP_SIZE": "two"}, "LWS_GROUP"),
        (
            ["--tensor-parallel-size", "2", "--distributed-executor-backend", "external_launcher"],
            LWS_WORKER,
            "nnodes > 1 is for ranks the engine starts itself",
        ),
    ],
)
def test_bad_node_settings_exit_2_saying_why(argv, environ, message, capsys, monkeypatch):
    for name in ("LWS_GROUP_SIZE", "LWS_WORKER_INDEX", "LWS_LEADER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    # The one-shot command line takes the same flags and refuses the same way.
    assert cli.main(["--input", "hi", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("leader", ("leader", DEFAULT_PORT)),
        ("leader:1234", ("leader", 1234)),
        ("10.0.0.5:29501", ("10.0.0.5", 29501)),
        ("[fd00::5]:1234", ("fd00::5", 1234)),
        ("[fd00::5]", ("fd00::5", DEFAULT_PORT)),
        ("fd00::5", ("fd00::5", DEFAULT_PORT)),
    ],
)
def test_init_addresses(text: str, expected: tuple[str, int]):
    assert split_init_addr(text) == expected


@pytest.mark.parametrize("text", ["", ":1234", "leader:http", "leader:70000", "[fd00::5]1"])
def test_bad_init_addresses(text: str):
    with pytest.raises(ConfigError, match="dist_init_addr"):
        split_init_addr(text)


def test_each_node_runs_a_block_of_ranks_on_its_own_gpus():
    assert [list(node_ranks(n, 8, 2)) for n in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [list(node_ranks(n, 4, 4)) for n in range(4)] == [[0], [1], [2], [3]]
    # A rank's GPU is its place on its node; on one node, its rank.
    env = {"GLOO_SOCKET_IFNAME": "eth1"}
    sixth = Rendezvous.for_node(5, 8, 2, "leader:1234", env)
    assert (sixth.host, sixth.port, sixth.local_rank) == ("leader", 1234, 1)
    assert sixth.gloo_interface == "eth1"
    one_node = Rendezvous.for_node(3, 4, 1, "leader:1234", env)
    assert (one_node.host, one_node.port, one_node.local_rank) == ("127.0.0.1", 0, 3)
    assert one_node.gloo_interface is None


def test_the_engine_runs_on_node_0_only(tmp_path):
    from hetero_infer.engine import LLMEngine
    from hetero_infer.engine.settings.exceptions import ExecutionError

    from tests.tiny_models import save_tiny_model

    folder = save_tiny_model("qwen2", tmp_path / "qwen2")
    config = EngineConfig(
        model=str(folder),
        tensor_parallel_size=2,
        nnodes=2,
        node_rank=1,
        dist_init_addr="127.0.0.1:1",
        max_num_blocks=16,
    )
    with pytest.raises(ExecutionError, match="the engine runs on node 0"):
        LLMEngine(config)
