"""EngineConfig: every engine setting in one flat, frozen, validated object.

Users write it the way both seed APIs did: ``EngineConfig(model=..., block_size=16)``.
It is read once (from arguments, a JSON file, or CLI flags) and passed down; nothing
deeper in the engine reads the environment.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any

from hetero_infer.engine.exceptions import ConfigError
from hetero_infer.engine.generation_defaults import GENERATION_MODES, check_override
from hetero_infer.engine.spec_decode.config import SpeculativeConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
PREEMPTION_MODES = ("auto", "recompute", "swap")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
QUANTIZATIONS = ("auto", "none", "gguf", "int8", "compressed-tensors")
POOLINGS = ("last", "mean")
SCHEDULING_POLICIES = ("fcfs", "priority")
# vLLM's names: "mp", the engine starts the other ranks as local processes;
# "external_launcher", torchrun did (its RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).
DISTRIBUTED_EXECUTOR_BACKENDS = ("mp", "external_launcher")
# Quantizations whose blocks are kept as stored: tensor parallelism does not split them.
KEPT_QUANTIZED = ("gguf", "int8", "compressed-tensors")

# Keys users of the seed APIs write (see EngineConfig's InitVars).
ALIASES = {"max_total_tokens": "max_num_batched_tokens", "max_batch_size": "max_num_seqs"}
# Sections of the seed's config.json that belong to the server (server/cli.py reads them).
SERVER_SECTIONS = ("serving",)
# Keys of the seed's config.json with no meaning here: refused, saying why.
UNSUPPORTED_SEED_KEYS = {
    "max_retry_attempts": "a failed step is not retried: it fails its requests",
    "special_tokens": "special token ids come from the model's tokenizer",
}


@dataclass(frozen=True)
class EngineConfig:
    # Weights: a local folder, a hub id, or a .gguf file. None = the embedded default.
    model: str | None = None
    # Tokenizer source; None = the model's own.
    tokenizer: str | None = None
    # The activations' dtype (and the weights', where they are not kept quantized).
    dtype: str = "auto"
    # As vLLM's --quantization. "auto": a GGUF file's quantized weights, or a
    # compressed-tensors checkpoint's int8 ones, stay quantized where a kernel takes
    # them (dtype float32 dequantizes, so that fp32 stays exact against transformers).
    # "none": every weight is dequantized to dtype at load. "gguf" / "compressed-tensors":
    # the file's quantized weights kept, in any dtype. "int8": a float checkpoint's
    # linear weights quantized to int8 per output row at load.
    quantization: str = "auto"
    device: str = "auto"
    seed: int = 0

    # Paged KV cache.
    block_size: int = 16
    # None = sized from a memory budget (gpu_memory_utilization on CUDA,
    # kv_cache_memory bytes on the CPU).
    max_num_blocks: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory: int = 2 * 1024**3
    # CPU blocks that hold swapped-out sequences; 0 = no swap space.
    num_cpu_blocks: int = 0
    enable_prefix_caching: bool = True

    # Scheduling.
    max_num_seqs: int = 256
    max_model_len: int | None = None
    max_num_batched_tokens: int = 4096
    # New sequences are admitted only while KV usage stays under this fraction.
    memory_threshold: float = 0.9
    # "auto" swaps when CPU blocks exist and recomputes otherwise.
    preemption_mode: str = "auto"
    # As vLLM's --scheduling-policy: "fcfs", or "priority" (a request's priority, lower
    # first; running requests of a lower priority are preempted for it). The priority
    # policy preempts by recompute, so it takes no swap.
    scheduling_policy: str = "fcfs"
    # Seconds a request may take from its arrival, queueing included; a request may ask
    # for less. None: no limit.
    request_timeout: float | None = None
    # Seconds a request may wait in the queue before it is first scheduled; past that it
    # is refused (the server answers 503 with Retry-After, which a load balancer can send
    # elsewhere) rather than served late. None: it waits as long as it takes.
    max_queue_time: float | None = None

    # As vLLM's --generation-config: where requests' default sampling values come from.
    # "auto": the model's generation_config.json (when it has one); "vllm": the built-in
    # defaults; otherwise a folder holding a generation_config.json.
    generation_config: str = "auto"
    # Values over those, in generation_config.json's names (e.g. {"temperature": 0.5}).
    override_generation_config: dict[str, Any] | None = field(default=None, hash=False)

    attention_backend: str = "auto"
    # The C++ CPU kernels (kernels/csrc); false runs the torch code instead, with the
    # same results, more slowly.
    cpu_kernels: bool = True
    # Run every decode step eagerly instead of replaying captured CUDA graphs.
    enforce_eager: bool = False
    # As vLLM's --speculative-config: speculative decoding, e.g. {"method": "ngram",
    # "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}, or a
    # draft model: {"model": PATH, "num_speculative_tokens": 4} (engine/spec_decode/
    # config.py). None: off.
    speculative_config: dict[str, Any] | None = field(default=None, hash=False)
    # How /v1/embeddings pools a prompt's final hidden states (engine/worker/pooler.py):
    # "last" (the last token's, vLLM's default for decoder models) or "mean".
    pooling: str = "last"

    # As vLLM's --tensor-parallel-size: the model's heads, MLP columns and vocabulary
    # split over this many ranks (processes), each holding its share of the KV cache
    # (engine/distributed/). 1: one process, as without it.
    tensor_parallel_size: int = 1
    # Who starts the other ranks: "mp" (the engine, as local processes) or
    # "external_launcher" (torchrun).
    distributed_executor_backend: str = "mp"

    # The seed API's name for max_num_batched_tokens.
    max_total_tokens: InitVar[int | None] = None
    # The seed API's most sequences in one step. Here every running sequence takes
    # part in every step, so it caps max_num_seqs (the seed's config.json gives both,
    # e.g. 32 and 256: 32 sequences run at once).
    max_batch_size: InitVar[int | None] = None

    def __post_init__(self, max_total_tokens: int | None, max_batch_size: int | None) -> None:
        if max_total_tokens is not None:
            object.__setattr__(self, "max_num_batched_tokens", max_total_tokens)
        if max_batch_size is not None:
            _check_int("max_batch_size", max_batch_size, minimum=1)
            _check_int("max_num_seqs", self.max_num_seqs, minimum=1)
            object.__setattr__(self, "max_num_seqs", min(self.max_num_seqs, max_batch_size))
        self._validate()

    def _validate(self) -> None:
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("quantization", self.quantization, QUANTIZATIONS)
        _check_choice("device", self.device, DEVICES)
        _check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice("pooling", self.pooling, POOLINGS)
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory"):
            _check_int(name, getattr(self, name), minimum=1)
        for name in ("max_num_blocks", "max_model_len"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), minimum=1)
        _check_int("num_cpu_blocks", self.num_cpu_blocks, minimum=0)
        _check_int("seed", self.seed, minimum=0)
        for name in ("memory_threshold", "gpu_memory_utilization"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
                raise ConfigError(f"{name} must be a number in (0, 1], got {value!r}")
        for name in ("enable_prefix_caching", "cpu_kernels", "enforce_eager"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("model", "tokenizer"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name} must be a non-empty string or null, got {value!r}")
        if self.preemption_mode == "swap" and self.num_cpu_blocks == 0:
            raise ConfigError("preemption_mode 'swap' needs num_cpu_blocks > 0")
        self._validate_scheduling()
        self._validate_generation_config()
        self._validate_parallel()
        _ = self.speculative  # a ConfigError here, at start-up, not at the first request

    def _validate_scheduling(self) -> None:
        _check_choice("scheduling_policy", self.scheduling_policy, SCHEDULING_POLICIES)
        if self.scheduling_policy == "priority" and self.use_swap:
            raise ConfigError(
                "scheduling_policy 'priority' preempts by recompute, not swap: set "
                "preemption_mode 'recompute' (or num_cpu_blocks 0)"
            )
        for name in ("request_timeout", "max_queue_time"):
            seconds = getattr(self, name)
            if seconds is not None and (not _is_number(seconds) or not 0 < seconds < float("inf")):
                raise ConfigError(f"{name} must be a number of seconds > 0, got {seconds!r}")

    def _validate_parallel(self) -> None:
        _check_int("tensor_parallel_size", self.tensor_parallel_size, minimum=1)
        _check_choice(
            "distributed_executor_backend",
            self.distributed_executor_backend,
            DISTRIBUTED_EXECUTOR_BACKENDS,
        )
        if self.tensor_parallel_size > 1 and self.quantization in KEPT_QUANTIZED:
            raise ConfigError(
                f"quantization {self.quantization!r} keeps quantized blocks, which tensor "
                "parallelism does not split: use 'auto' or 'none' (weights dequantized at "
                "load) with tensor_parallel_size > 1"
            )

    def _validate_generation_config(self) -> None:
        mode = self.generation_config
        if not isinstance(mode, str) or not mode:
            raise ConfigError(
                f"generation_config must be {', '.join(GENERATION_MODES)} or a folder, got {mode!r}"
            )
        if self.override_generation_config is not None:
            check_override(self.override_generation_config)

    @property
    def speculative(self) -> SpeculativeConfig | None:
        """speculative_config, checked; None when speculative decoding is off."""
        if self.speculative_config is None:
            return None
        return SpeculativeConfig.from_dict(self.speculative_config)

    @property
    def use_swap(self) -> bool:
        if self.preemption_mode == "auto":
            return self.num_cpu_blocks > 0
        return self.preemption_mode == "swap"

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)] + list(ALIASES)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> EngineConfig:
        """Build from a flat mapping; unknown keys are an error naming the key."""
        known = set(cls.field_names())
        for key in values:
            if key in UNSUPPORTED_SEED_KEYS:
                raise ConfigError(
                    f"{source}: {key!r} is not supported: {UNSUPPORTED_SEED_KEYS[key]}"
                )
            if key not in known:
                raise ConfigError(f"{source}: unknown key {key!r}")
        tokenizer = values.get("tokenizer")
        if isinstance(tokenizer, dict):  # the seed's {"kind": ..., "path": ...}
            values = {**values, "tokenizer": _seed_tokenizer(tokenizer, source)}
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> EngineConfig:
        """Read a JSON file (flat, or with the settings under an "engine" key)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: invalid JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a JSON object at the top level")
        if isinstance(data.get("engine"), dict):
            data = data["engine"]
        # "_comment" keys, and the server's section of the seed's layout.
        data = {k: v for k, v in data.items() if not k.startswith("_") and k not in SERVER_SECTIONS}
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data, source=str(path))

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_section(path: str | Path, section: str) -> dict[str, Any]:
    """One section of a config file (e.g. the seed's "serving"); {} when it has none.
    The file was already read and checked by from_file."""
    data = json.loads(Path(path).read_text())
    value = data.get(section) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _seed_tokenizer(spec: dict[str, Any], source: str) -> str | None:
    """The seed's tokenizer section -> a tokenizer source (None: the model's own)."""
    kind, path = spec.get("kind", "huggingface"), spec.get("path")
    if set(spec) - {"kind", "path"} or kind not in ("huggingface", "simple"):
        raise ConfigError(f"{source}: tokenizer must be {{'kind': 'huggingface', 'path': ...}}")
    if kind == "simple":
        raise ConfigError(
            f"{source}: tokenizer kind 'simple' (the seed's test tokenizer) does not fit a real "
            "model: give 'huggingface' with a path (or null for the model's own), or pass a "
            "tokenizer object to the engine"
        )
    return path


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
