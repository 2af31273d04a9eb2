"""EngineSetup: what an EngineConfig comes to on this machine, worked out once.

The config is what users write: flat, with "auto" where they leave a choice to us. The
setup is what the engine runs with: the model's source and its ModelConfig, the
context length, the device and the dtype, the speculative config and the default
sampling values, each resolved once, here. LLMEngine and every tensor-parallel rank
build from it, so no part of the engine resolves a setting again.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.engine import loader
from hetero_infer.engine.loader.gguf_header import gguf_file_type
from hetero_infer.engine.loader.weights import checkpoint_quantized_by
from hetero_infer.engine.models import ModelConfig
from hetero_infer.engine.params.generation_defaults import (
    GenerationDefaults,
    load_generation_defaults,
)
from hetero_infer.engine.settings import host_memory
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.exceptions import ConfigError, OutOfMemoryError
from hetero_infer.engine.settings.speculative_config import SpeculativeConfig
from hetero_infer.kernels import has_bf16_matmul, kernel_unavailable, kv_cache_torch_dtype

# GGUF file types whose projections are all of types the CPU's quantized kernel takes
# (kernels/linear_quantized.py; a K-quant file mixes Q4_K to Q6_K with Q5_0 and Q8_0).
KERNEL_FILE_TYPES = frozenset(
    ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K")
)


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
    generation_defaults: GenerationDefaults


def resolve_setup(config: EngineConfig) -> EngineSetup:
    """The setup for ``config`` (the model's config is read, not its weights)."""
    source = loader.resolve_model(config.model)
    model_config = ModelConfig.from_hf(loader.load_config(source))
    image_tokens = model_config.vision.bidirectional_tokens if model_config.vision else 0
    if image_tokens > config.max_num_batched_tokens:
        raise ConfigError(
            f"max_num_batched_tokens ({config.max_num_batched_tokens}) must hold one image's "
            f"{image_tokens} tokens, which {model_config.architecture} computes in one step"
        )
    device = resolve_device(config.device)
    check_host_memory(config, source, device)
    dtype = resolve_dtype(config.dtype, device, bf16_kernels_on_cpu(config, source, device))
    return EngineSetup(
        config=config,
        source=source,
        model_config=model_config,
        max_model_len=model_config.resolve_max_model_len(config.max_model_len),
        device=device,
        dtype=dtype,
        kv_cache_dtype=resolve_kv_cache_dtype(config.kv_cache_dtype, device, dtype),
        speculative=config.speculative,
        generation_defaults=load_generation_defaults(
            config.generation_config,
            config.override_generation_config,
            source.folder,
            loader.packaged_sampling(config.model),
        ),
    )


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but no CUDA GPU is available")
    return torch.device(device)


def check_host_memory(
    config: EngineConfig, source: loader.ModelSource, device: torch.device
) -> None:
    """On the CPU, the KV cache (kv_cache_memory) and the weights must fit in the memory
    the process can have. Linux would grant a larger cache (it overcommits) and kill
    the process once requests filled it: an OutOfMemoryError at start instead."""
    if device.type != "cpu" or config.max_num_blocks:
        return
    limit = host_memory.memory_limit()
    weights = source.weight_bytes()
    if config.kv_cache_memory + weights > limit:
        raise OutOfMemoryError(
            f"kv_cache_memory ({config.kv_cache_memory / 2**30:.1f} GiB) and the model's "
            f"weights ({weights / 2**30:.1f} GiB) are more than the "
            f"{limit / 2**30:.1f} GiB of memory this process can have: lower "
            "--kv-cache-memory"
        )


def resolve_dtype(dtype: str, device: torch.device, bf16_kernels: bool = False) -> torch.dtype:
    """``bf16_kernels``: the CPU's own kernels would run the model's projections in bf16
    (bf16_kernels_on_cpu)."""
    if dtype == "auto":
        # bf16 halves the bytes a decode step reads. Where the CPU lacks bf16 instructions
        # torch emulates bf16 matmuls, slower than fp32, but our kernels need none: the
        # int8 kernel on quantized projections (in fp32 they would be dequantized, to
        # stay exact against transformers), and the bf16 linear kernel, which widens the
        # pairs to fp32. On a Cascade Lake Xeon SmolLM2's Q4_1 file decoded one stream at
        # 139 tokens/s in bf16, 21 in fp32; its float weights 40 against 12.
        if device.type == "cpu" and not has_bf16_matmul() and not bf16_kernels:
            return torch.float32
        return torch.bfloat16
    return getattr(torch, dtype)


def bf16_kernels_on_cpu(
    config: EngineConfig, source: loader.ModelSource, device: torch.device
) -> bool:
    """Whether the CPU's own kernels would run the model's projections in bf16: the int8
    kernel on projections kept quantized (quantized_on_cpu), or the bf16 linear kernel
    on the others (it needs AVX-512, not AVX512-BF16)."""
    if device.type != "cpu" or not config.cpu_kernels:
        return False
    return kernel_unavailable("linear_packed") is None or quantized_on_cpu(config, source, device)


def quantized_on_cpu(
    config: EngineConfig, source: loader.ModelSource, device: torch.device
) -> bool:
    """Whether the model's projections would stay quantized on the CPU's int8 kernel
    (kernels/linear_quantized.py) in bf16: a GGUF file of KERNEL_FILE_TYPES, an int8
    checkpoint or ``quantization`` int8, kept as stored (worker/model_loader.py's
    keeps_quantized: not with tensor parallelism or quantization none), where the
    kernel is built and the C++ kernels are on."""
    if device.type != "cpu" or config.quantization == "none" or config.tensor_parallel_size > 1:
        return False
    if not config.cpu_kernels or kernel_unavailable("quantized_linear") is not None:
        return False
    quantized_by = checkpoint_quantized_by(source)
    if quantized_by == "gguf":
        return gguf_file_type(source.path) in KERNEL_FILE_TYPES
    return config.quantization == "int8" or quantized_by is not None


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
