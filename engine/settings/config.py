"""EngineConfig: every engine setting in one flat, frozen, validated object.

Users write it the way both seed APIs did: ``EngineConfig(model=..., block_size=16)``.
It is read once (from arguments, a JSON file, or CLI flags) and passed down; nothing
deeper in the engine reads the environment.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any

from hetero_infer.engine.settings.choices import (
    ATTENTION_BACKENDS,
    CPU_LINEAR_KERNELS,
    DEVICES,
    DISTRIBUTED_EXECUTOR_BACKENDS,
    DTYPES,
    KV_CACHE_DTYPES,
    POOLINGS,
    PREEMPTION_MODES,
    PREFIX_CACHING_HASH_ALGOS,
    QUANTIZATIONS,
    SCHEDULING_POLICIES,
)
from hetero_infer.engine.settings.config_checks import check_config, check_int
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.engine.settings.seed_layout import (
    ALIASES,
    UNSUPPORTED_SEED_KEYS,
    engine_settings,
    seed_tokenizer,
)
from hetero_infer.engine.settings.speculative_config import SpeculativeConfig


def setting(
    default: Any,
    help: str,
    choices: tuple[str, ...] | None = None,
    serving: bool = False,
    **kwargs: Any,
) -> Any:
    """An EngineConfig field with its help text (and its allowed values, checked at
    construction): the command line's flag and its HETERO_* variable are made from
    these (server/cli.py), so a setting is declared once, here. ``serving``: a setting
    of how requests are served, which one-shot generation has no flag for."""
    metadata: dict[str, Any] = {"help": help, "serving": serving}
    if choices is not None:
        metadata["choices"] = choices
    return field(default=default, metadata=metadata, **kwargs)


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = setting(
        None, "the weights: a local folder, a hub id or a .gguf file (none: the embedded SmolLM2)"
    )
    tokenizer: str | None = setting(None, "the tokenizer's source (none: the model's own)")
    dtype: str = setting(
        "auto", "the activations' dtype (and the weights', where not kept quantized)", DTYPES
    )
    quantization: str = setting(
        "auto",
        "as vLLM's: auto keeps a GGUF file's blocks or a compressed-tensors checkpoint's int8 "
        "weights where a kernel takes them (float32 dequantizes, to stay exact); none "
        "dequantizes every weight at load; gguf and compressed-tensors keep the file's; "
        "int8 quantizes a float checkpoint's linear weights per output row at load",
        QUANTIZATIONS,
    )
    device: str = setting("auto", "where the model runs", DEVICES)
    seed: int = setting(0, "the engine's seed: the draws of requests that give none")

    # Paged KV cache.
    block_size: int = setting(16, "tokens per KV block")
    max_num_blocks: int | None = setting(
        None, "KV blocks (none: from gpu_memory_utilization on CUDA, kv_cache_memory on the CPU)"
    )
    gpu_memory_utilization: float = setting(
        0.9, "the share of the GPU's memory the engine may use, the KV cache included"
    )
    kv_cache_memory: int = setting(2 * 1024**3, "bytes of KV cache on the CPU")
    kv_cache_prefault: bool = setting(
        False, "write the KV cache once at start, as vLLM does, not as its blocks are first used"
    )
    num_cpu_blocks: int = setting(0, "CPU blocks that hold swapped-out sequences (0: no swap)")
    enable_prefix_caching: bool = setting(True, "reuse the KV blocks of a repeated prefix")
    prefix_caching_hash_algo: str = setting(
        "keyed",
        "the prefix cache's block hashes: keyed (ours, a key per replica) or sha256_cbor "
        "(vLLM's, unkeyed: with PYTHONHASHSEED set, the hashes routers compute)",
        PREFIX_CACHING_HASH_ALGOS,
    )
    kv_offloading_size: float = setting(
        0.0,
        "as vLLM's: GiB of host RAM that keep the prefix cache's blocks as the KV cache "
        "evicts them, to be copied back on a hit instead of recomputed (0: none)",
    )
    kv_offloading_dir: str | None = setting(
        None,
        "a directory the cached blocks are written to as they are computed (off the step), "
        "kept across restarts and shared by the replicas that name it (needs "
        "kv_offloading_size; docs/kv-tiers.md)",
    )
    kv_offloading_dir_size: float = setting(
        16.0, "GiB kv_offloading_dir may hold; its least recently used files go first"
    )
    kv_offloading_flush_timeout: float = setting(
        10.0,
        "seconds a graceful stop may spend writing to kv_offloading_dir the cached blocks "
        "it lacks, so that a restart finds them (each block is written as it is computed; "
        "these are the last ones)",
    )
    kv_events_config: str | None = setting(
        None,
        "as vLLM's --kv-events-config: JSON of its KVEventsConfig, e.g. "
        '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557"}: '
        "the prefix cache's blocks stored and removed, published over ZeroMQ for routers",
    )
    kv_cache_dtype: str = setting(
        "auto",
        "as vLLM's: how keys and values are stored: auto (the model's dtype), int8 (an fp16 scale "
        "per 32 values: about twice the tokens in the same memory), fp8 (e4m3, CUDA only)",
        KV_CACHE_DTYPES,
    )

    # Scheduling.
    max_num_seqs: int = setting(256, "the most sequences in one step")
    max_model_len: int | None = setting(None, "the context length (none: the model's own)")
    max_num_batched_tokens: int = setting(4096, "the most tokens in one step")
    memory_threshold: float = setting(
        0.9, "new sequences are admitted only while KV usage stays under this fraction"
    )
    preemption_mode: str = setting(
        "auto", "auto swaps when CPU blocks exist and recomputes otherwise", PREEMPTION_MODES
    )
    scheduling_policy: str = setting(
        "fcfs",
        "as vLLM's: fcfs (arrival order), or priority (requests' priority field, lower first; "
        "lower-priority running requests are preempted, by recompute, for higher ones)",
        SCHEDULING_POLICIES,
        serving=True,
    )
    request_timeout: float | None = setting(
        None,
        "seconds a request may take from its arrival, queueing included (a request may "
        "ask for less)",
        serving=True,
    )
    max_queue_time: float | None = setting(
        None,
        "seconds a request may wait in the queue before it starts; past that it is refused "
        "(the server answers 503 with Retry-After, for a load balancer to retry elsewhere) "
        "rather than served late",
        serving=True,
    )
    generation_config: str = setting(
        "auto",
        "as vLLM's: where default sampling values come from: auto (the model's "
        "generation_config.json), vllm (the built-in ones), or a folder holding one",
        serving=True,
    )
    override_generation_config: dict[str, Any] | None = setting(
        None,
        "JSON over the generation config's values, in its names, e.g. '{\"temperature\": 0.5}'",
        hash=False,
        serving=True,
    )

    attention_backend: str = setting(
        "auto", "auto: Triton on CUDA, the C++ kernels on the CPU", ATTENTION_BACKENDS
    )
    cpu_kernels: bool = setting(
        True, "false: the torch code instead of the C++ CPU kernels (same results, slower)"
    )
    cpu_amx: bool = setting(True, "AMX's tiles where the CPU has them; false: AVX-512 code instead")
    cpu_linear_kernel: str = setting(
        "kernel", "which bf16 kernel runs a projection's rows (docs/cpu.md)", CPU_LINEAR_KERNELS
    )
    enforce_eager: bool = setting(False, "no CUDA graphs: run every decode step eagerly")
    async_scheduling: bool | None = setting(
        False, "as vLLM's: schedule step N+1 while the model computes step N (null: off)"
    )
    speculative_config: dict[str, Any] | None = setting(
        None,
        'speculative decoding, as vLLM\'s: JSON, e.g. \'{"method": "ngram", '
        '"num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}\' '
        'or, with a draft model of the same tokenizer, \'{"model": "PATH", '
        '"num_speculative_tokens": 4}\' ("default": the embedded model)',
        hash=False,
    )
    pooling: str = setting(
        "last", "how /v1/embeddings pools a prompt: last (vLLM's default) or mean", POOLINGS
    )
    mm_processor_kwargs: dict[str, Any] | None = setting(
        None,
        "as vLLM's: JSON over the image processor's settings that size or scale an image, "
        "e.g. '{\"max_pixels\": 1003520}' (docs/models.md)",
        hash=False,
    )

    enable_lora: bool = setting(False, "as vLLM's: serve LoRA adapters on the model (docs/lora.md)")
    max_loras: int = setting(4, "as vLLM's: LoRA adapters loaded at once (each one's slot)")
    max_lora_rank: int = setting(16, "as vLLM's: the highest LoRA rank an adapter may have")

    tensor_parallel_size: int = setting(
        1, "as vLLM's: ranks the model's heads, MLP columns and vocabulary are split over"
    )
    distributed_executor_backend: str = setting(
        "mp",
        "who starts the other ranks: mp (the engine, as local processes) or "
        "external_launcher (torchrun)",
        DISTRIBUTED_EXECUTOR_BACKENDS,
    )
    # Over several machines, as SGLang's flags (LeaderWorkerSet's variables by default).
    nnodes: int = setting(
        1, "as SGLang's: the machines the ranks span, tensor_parallel_size / nnodes on each"
    )
    node_rank: int = setting(
        0, "as SGLang's: this machine's among them; node 0 runs the engine and the server"
    )
    dist_init_addr: str | None = setting(
        None, "as SGLang's: HOST:PORT where node 0 hosts the ranks' rendezvous (nnodes > 1)"
    )

    # The seed API's name for max_num_batched_tokens.
    max_total_tokens: InitVar[int | None] = None
    # The seed API's most sequences in one step: it caps max_num_seqs, since every running
    # sequence takes part in every step (its config.json's 32 and 256: 32 run at once).
    max_batch_size: InitVar[int | None] = None

    def __post_init__(self, max_total_tokens: int | None, max_batch_size: int | None) -> None:
        if max_total_tokens is not None:
            object.__setattr__(self, "max_num_batched_tokens", max_total_tokens)
        if max_batch_size is not None:
            check_int("max_batch_size", max_batch_size, minimum=1)
            check_int("max_num_seqs", self.max_num_seqs, minimum=1)
            object.__setattr__(self, "max_num_seqs", min(self.max_num_seqs, max_batch_size))
        check_config(self)

    @functools.cached_property
    def speculative(self) -> SpeculativeConfig | None:
        """speculative_config, checked (once: the config is frozen); None when
        speculative decoding is off."""
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
            values = {**values, "tokenizer": seed_tokenizer(tokenizer, source)}
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: {exc}") from exc

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> EngineConfig:
        """Read a JSON file (flat, or with the settings under an "engine" key)."""
        data = engine_settings(Path(path))
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_dict(data, source=str(path))

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
