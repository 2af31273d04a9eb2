"""Where the tensor-parallel ranks meet, and who this process is among them: plain
data, read from torchrun's environment without importing torch (the server reads it
before anything heavy loads)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetero_infer.engine.settings.exceptions import ConfigError

LOOPBACK = "127.0.0.1"


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
                port=int(environ.get("MASTER_PORT", "29500")),
                launcher_hosts_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
                local_rank=int(environ.get("LOCAL_RANK", environ["RANK"])),
            )
        except ValueError as exc:
            raise ConfigError(f"torchrun's environment: {exc}") from exc
