"""The rules an EngineConfig follows, checked once as it is made: a ConfigError that
names the field (and what it takes) otherwise."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar, Protocol

from hetero_infer.engine.params.generation_defaults import GENERATION_MODES, check_override
from hetero_infer.engine.settings.dist_init_addr import split_init_addr
from hetero_infer.engine.settings.exceptions import ConfigError

# Quantizations whose blocks are kept as stored: tensor parallelism does not split them.
KEPT_QUANTIZED = ("gguf", "int8", "compressed-tensors")


class CheckedConfig(Protocol):
    """What the rules read of a config (config.py's EngineConfig, which checks itself
    with them as it is made): a dataclass, whose other fields they read by name, and
    these by attribute. A value is as given until its rule passes, hence Any."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    seed: Any
    num_cpu_blocks: Any
    preemption_mode: Any
    use_swap: bool
    scheduling_policy: Any
    async_scheduling: Any
    kv_offloading_size: Any
    kv_offloading_flush_timeout: Any
    kv_offloading_dir: Any
    tensor_parallel_size: Any
    distributed_executor_backend: Any
    nnodes: Any
    node_rank: Any
    dist_init_addr: Any
    quantization: Any
    enable_lora: Any
    max_loras: Any
    max_lora_rank: Any
    generation_config: Any
    override_generation_config: Any
    speculative: Any  # speculative_config, read (and checked) as it is asked for


def check_config(config: CheckedConfig) -> None:
    """Every rule a config must follow; a ConfigError naming the field otherwise."""
    for f in fields(config):
        if "choices" in f.metadata:
            check_choice(f.name, getattr(config, f.name), f.metadata["choices"])
    for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory"):
        check_int(name, getattr(config, name), minimum=1)
    for name in ("max_num_blocks", "max_model_len"):
        if getattr(config, name) is not None:
            check_int(name, getattr(config, name), minimum=1)
    check_int("num_cpu_blocks", config.num_cpu_blocks, minimum=0)
    check_int("seed", config.seed, minimum=0)
    for name in ("memory_threshold", "gpu_memory_utilization"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
            raise ConfigError(f"{name} must be a number in (0, 1], got {value!r}")
    for name in ("enable_prefix_caching", "cpu_kernels", "enforce_eager", "enable_lora"):
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name} must be true or false, got {getattr(config, name)!r}")
    for name in ("model", "tokenizer"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a non-empty string or null, got {value!r}")
    if config.preemption_mode == "swap" and config.num_cpu_blocks == 0:
        raise ConfigError("preemption_mode 'swap' needs num_cpu_blocks > 0")
    _check_scheduling(config)
    _check_kv_offloading(config)
    _check_generation_config(config)
    _check_parallel(config)
    _check_nodes(config)
    _ = config.speculative  # a ConfigError here, at start-up, not at the first request


def _check_scheduling(config: CheckedConfig) -> None:
    if config.scheduling_policy == "priority" and config.use_swap:
        raise ConfigError(
            "scheduling_policy 'priority' preempts by recompute, not swap: set "
            "preemption_mode 'recompute' (or num_cpu_blocks 0)"
        )
    for name in ("request_timeout", "max_queue_time"):
        seconds = getattr(config, name)
        if seconds is not None and (not _is_number(seconds) or not 0 < seconds < float("inf")):
            raise ConfigError(f"{name} must be a number of seconds > 0, got {seconds!r}")
    if config.async_scheduling not in (None, True, False):
        raise ConfigError(
            f"async_scheduling must be true, false or null, got {config.async_scheduling!r}"
        )
    if config.async_scheduling and config.speculative is not None:
        # The drafts of a step are made from the tokens of the step before.
        raise ConfigError("async_scheduling cannot be combined with speculative_config")


def _check_kv_offloading(config: CheckedConfig) -> None:
    for name in ("kv_offloading_size", "kv_offloading_dir_size"):
        value = getattr(config, name)
        if not _is_number(value) or not 0 <= value < float("inf"):
            raise ConfigError(f"{name} must be a number of GiB >= 0, got {value!r}")
    timeout = config.kv_offloading_flush_timeout
    if not _is_number(timeout) or not 0 <= timeout < float("inf"):
        raise ConfigError(
            f"kv_offloading_flush_timeout must be a number of seconds >= 0, got {timeout!r}"
        )
    directory = config.kv_offloading_dir
    if directory is not None and (not isinstance(directory, str) or not directory):
        raise ConfigError(f"kv_offloading_dir must be a folder's path or null, got {directory!r}")
    if not config.kv_offloading_size:
        if directory is not None:
            raise ConfigError(
                "kv_offloading_dir needs kv_offloading_size > 0: blocks reach the disk "
                "through host RAM"
            )
        return
    if config.tensor_parallel_size > 1:
        raise ConfigError("kv_offloading_size: the KV tiers serve one rank; not with TP > 1")
    spec = config.speculative
    if spec is not None and spec.uses_draft_model:
        raise ConfigError(
            "kv_offloading_size: the KV tiers keep the target's KV only, not a draft model's"
        )


def _check_parallel(config: CheckedConfig) -> None:
    check_int("tensor_parallel_size", config.tensor_parallel_size, minimum=1)
    check_int("max_loras", config.max_loras, minimum=1)
    check_int("max_lora_rank", config.max_lora_rank, minimum=1)
    if config.enable_lora and config.tensor_parallel_size > 1:
        raise ConfigError("enable_lora does not work with tensor_parallel_size > 1 yet")
    if config.tensor_parallel_size > 1 and config.quantization in KEPT_QUANTIZED:
        raise ConfigError(
            f"quantization {config.quantization!r} keeps quantized blocks, which tensor "
            "parallelism does not split: use 'auto' or 'none' (weights dequantized at "
            "load) with tensor_parallel_size > 1"
        )


def _check_nodes(config: CheckedConfig) -> None:
    check_int("nnodes", config.nnodes, minimum=1)
    check_int("node_rank", config.node_rank, minimum=0)
    if config.node_rank >= config.nnodes:
        raise ConfigError(
            f"node_rank must be in 0..{config.nnodes - 1} (nnodes {config.nnodes}), "
            f"got {config.node_rank}"
        )
    if config.tensor_parallel_size % config.nnodes:
        raise ConfigError(
            f"tensor_parallel_size ({config.tensor_parallel_size}) must be a multiple of "
            f"nnodes ({config.nnodes}): each node runs as many ranks"
        )
    if config.dist_init_addr is not None:
        split_init_addr(config.dist_init_addr)
    if config.nnodes == 1:
        return
    if config.dist_init_addr is None:
        raise ConfigError(
            f"nnodes {config.nnodes} needs dist_init_addr: HOST:PORT where node 0 hosts the "
            "rendezvous, an address every node reaches"
        )
    if config.distributed_executor_backend != "mp":
        raise ConfigError(
            "nnodes > 1 is for ranks the engine starts itself (distributed_executor_backend "
            "'mp'); torchrun places its ranks over machines with its own --nnodes"
        )


def _check_generation_config(config: CheckedConfig) -> None:
    mode = config.generation_config
    if not isinstance(mode, str) or not mode:
        raise ConfigError(
            f"generation_config must be {', '.join(GENERATION_MODES)} or a folder, got {mode!r}"
        )
    if config.override_generation_config is not None:
        check_override(config.override_generation_config)


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
