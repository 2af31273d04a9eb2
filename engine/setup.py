"""EngineSetup: what an EngineConfig comes to on this machine, worked out once.

The config is what users write: flat, with "auto" where they leave a choice to us. The
setup is what the engine runs with: the model's source and its ModelConfig, the
context length, the device and the dtype, and the speculative config, each resolved
once, here. LLMEngine and every tensor-parallel rank build from it, so no part of the
engine resolves a setting again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.engine import loader
from hetero_infer.engine.config import EngineConfig
from hetero_infer.engine.exceptions import ConfigError
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.speculative_config import SpeculativeConfig
from hetero_infer.kernels import has_bf16_matmul, kv_cache_torch_dtype


@dataclass(frozen=True)
class EngineSetup:
    config: EngineConfig
    source: loader.ModelSource
    model_config: ModelConfig
    max_model_len: int
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype  # the cache tensors' (int8 rows carry their scales)
    speculative: SpeculativeConfig | None


def resolve_setup(config: EngineConfig) -> EngineSetup:
    """The setup for ``config`` (the model's config is read, not its weights)."""
    source = loader.resolve_model(config.model)
    model_config = ModelConfig.from_hf(loader.load_config(source))
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    return EngineSetup(
        config=config,
        source=source,
        model_config=model_config,
        max_model_len=model_config.resolve_max_model_len(config.max_model_len),
        device=device,
        dtype=dtype,
        kv_cache_dtype=resolve_kv_cache_dtype(config.kv_cache_dtype, device, dtype),
        speculative=config.speculative,
    )


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but no CUDA GPU is available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # bf16 halves the bytes a decode step reads and doubles matmul throughput where
        # the CPU computes in bf16; elsewhere bf16 is emulated and slower than fp32.
        if device.type == "cpu" and not has_bf16_matmul():
            return torch.float32
        return torch.bfloat16
    return getattr(torch, dtype)


def resolve_kv_cache_dtype(
    kv_cache_dtype: str, device: torch.device, dtype: torch.dtype
) -> torch.dtype:
    # The CPU kernels read int8 rows; fp8 has no conversion on this CPU's vector units,
    # so it is refused at start rather than run through the slow torch reference.
    if kv_cache_dtype == "fp8" and device.type != "cuda":
        raise ConfigError(
            "kv_cache_dtype 'fp8' (--kv-cache-dtype fp8) needs a CUDA GPU; on the CPU use "
            "--kv-cache-dtype int8 (or auto)"
        )
    # Triton's e4m3 needs sm89 or later (Ada, Hopper); an A100 would fail to compile.
    if kv_cache_dtype == "fp8" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ConfigError(
            "kv_cache_dtype 'fp8' (--kv-cache-dtype fp8) needs a GPU of compute capability "
            "8.9 or later (Triton has no e4m3 before it); use --kv-cache-dtype int8 (or auto)"
        )
    return kv_cache_torch_dtype(kv_cache_dtype, dtype)
