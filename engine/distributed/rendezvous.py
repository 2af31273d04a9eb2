"""Where the tensor-parallel ranks meet, and who this process is among them: plain
data, read from torchrun's environment or from the engine's node settings without
importing torch (the server reads it before anything heavy loads)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetero_infer.engine.settings.dist_init_addr import DEFAULT_PORT, split_init_addr
from hetero_infer.engine.settings.exceptions import ConfigError

LOOPBACK = "127.0.0.1"
# gloo's own variable: the network interface its connections use (as NCCL_SOCKET_IFNAME).
GLOO_INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet, and who this one is."""

    rank: int
    world_size: int
    host: str = LOOPBACK
    port: int = 0
    # torchrun's agent hosts the store itself; otherwise rank 0 does.
    launcher_hosts_store: bool = False
    # The GPU this rank uses, where there are several (torchrun's LOCAL_RANK).
    local_rank: int = 0
    # The network interface gloo binds to (GLOO_SOCKET_IFNAME); None: the one that
    # reaches ``host`` (see process_group.py).
    gloo_interface: str | None = None

    @classmethod
    def from_torchrun_env(cls, environ: Mapping[str, str]) -> Rendezvous | None:
        """The rendezvous torchrun set up (None when not started by torchrun)."""
        if "RANK" not in environ or "WORLD_SIZE" not in environ:
            return None
        try:
            return cls(
                rank=int(environ["RANK"]),
                world_size=int(environ["WORLD_SIZE"]),
                host=environ.get("MASTER_ADDR", LOOPBACK),
                port=int(environ.get("MASTER_PORT", str(DEFAULT_PORT))),
                launcher_hosts_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
                gloo_interface=environ.get(GLOO_INTERFACE_VARIABLE) or None,
            )
        except ValueError as exc:
            raise ConfigError(f"torchrun's environment: {exc}") from exc

    @classmethod
    def for_node(
        cls,
        rank: int,
        world_size: int,
        nnodes: int,
        dist_init_addr: str | None,
        environ: Mapping[str, str],
    ) -> Rendezvous:
        """Rank ``rank`` of ranks the engine starts itself, ``world_size / nnodes`` on
        each node, node R holding ranks R*k .. R*k+k-1 (its GPUs 0 .. k-1). On one node
        they meet on loopback, at a port rank 0 picks; over several, at
        ``dist_init_addr``, where rank 0 hosts the store."""
        local_rank = rank % (world_size // nnodes)
        if nnodes == 1:
            return cls(rank=rank, world_size=world_size, local_rank=local_rank)
        if dist_init_addr is None:
            raise ConfigError("nnodes > 1 needs dist_init_addr: HOST:PORT of node 0")
        host, port = split_init_addr(dist_init_addr)
        return cls(
            rank=rank,
            world_size=world_size,
            host=host,
            port=port,
            local_rank=local_rank,
            gloo_interface=environ.get(GLOO_INTERFACE_VARIABLE) or None,
        )


def node_ranks(node_rank: int, world_size: int, nnodes: int) -> range:
    """The global ranks node ``node_rank`` runs: k = world_size / nnodes of them, in a
    block (node 0 holds rank 0, the engine's)."""
    per_node = world_size // nnodes
    return range(node_rank * per_node, (node_rank + 1) * per_node)
