"""Where the tensor-parallel ranks meet, and who this process is among them: plain
data, read from torchrun's environment or from the engine's node settings without
importing torch (the server reads it before anything heavy loads)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetero_infer.engine.settings.exceptions import ConfigError

LOOPBACK = "127.0.0.1"
# The rendezvous port when an address names none: torchrun's and SGLang's default.
DEFAULT_PORT = 29500
# gloo's own variable: the network interface its connections use (as NCCL_SOCKET_IFNAME).
GLOO_INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"


def split_init_addr(text: str) -> tuple[str, int]:
    """``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port); the port is
    DEFAULT_PORT when none is given. ConfigError naming the address otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"dist_init_addr must be HOST:PORT, got {text!r}")
    text = text.strip()
    if text.startswith("["):  # [::1]:29500: the brackets keep the address's colons apart
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":") if rest.startswith(":") else None
        if rest and port_text is None:
            raise ConfigError(f"dist_init_addr must be [HOST]:PORT, got {text!r}")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:  # no port, or a bare IPv6 address (its colons are not a port's)
        host, port_text = text, None
    if not host:
        raise ConfigError(f"dist_init_addr names no host: {text!r}")
    if port_text is None or port_text == "":
        return host, DEFAULT_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ConfigError(f"dist_init_addr's port must be in 1..65535, got {text!r}")
    return host, int(port_text)


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
