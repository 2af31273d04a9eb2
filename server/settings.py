"""ServerSettings: the HTTP side's settings (the engine's are in EngineConfig)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_infer.engine.config import EngineConfig

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
# The name the project's own examples send, answered by default beside the model's.
PROJECT_MODEL_NAME = "hetero-infer"


@dataclass(frozen=True)
class ServerSettings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    # The names clients may use in "model" (as vLLM's --served-model-name: the first is
    # the one responses report). Empty: the model path's last part and "hetero-infer".
    served_model_name: tuple[str, ...] | str = ()
    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    # Requests accepted but not yet finished, beyond which new ones get 503.
    max_waiting_requests: int = 1024
    max_body_bytes: int = 4 * 1024 * 1024
    # Seconds in-flight requests get to finish after SIGTERM.
    shutdown_timeout: float = 30.0

    def __post_init__(self) -> None:
        names = self.served_model_name
        if isinstance(names, str):
            names = tuple(n for n in names.replace(",", " ").split() if n)
        object.__setattr__(self, "served_model_name", tuple(names))
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be in 1..65535, got {self.port}")
        for name in ("max_waiting_requests", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be >= 0")

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name the server answers to, the reported one first."""
        if self.served_model_name:
            return self.served_model_name
        if self.engine.model is None:
            own = DEFAULT_MODEL_NAME
        else:
            own = self.engine.model.rstrip("/").split("/")[-1]
        return (own, PROJECT_MODEL_NAME) if own != PROJECT_MODEL_NAME else (own,)

    @property
    def model_name(self) -> str:
        """The name responses and metrics report."""
        return self.model_names[0]

    def redacted(self) -> dict:
        """The settings as a dict for the startup log, with secrets hidden."""
        values = {k: v for k, v in self.__dict__.items() if k != "engine"}
        values["api_key"] = "***" if self.api_key else None
        return {"server": values, "engine": self.engine.to_dict()}
