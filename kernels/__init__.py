"""Kernels the model calls, each with a torch implementation that runs anywhere.

The model imports these names only. Each call picks its implementation here: the
Triton kernel (kernels/*_triton.py) for CUDA tensors, the torch reference otherwise;
on CPU tensors, attention and the bf16/fp16 elementwise kernels run C++ kernels
(kernels/csrc, built on first use by kernels/cpu_extension.py) where they build.
``use_backend("torch" | "triton")`` forces one path for the calls made inside it (the
ModelRunner wraps each step in its config's ``attention_backend``); forcing "triton"
on CPU tensors needs Triton's interpreter (TRITON_INTERPRET=1), which tests use.

triton is imported on the first Triton call only, so the CPU path works without it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from contextvars import ContextVar
from types import SimpleNamespace

import torch
from hetero_infer.kernels.activation import silu_and_mul_ref
from hetero_infer.kernels.cpu_extension import cpu_kernels, elementwise_kernels
from hetero_infer.kernels.greedy import greedy_pick_ref
from hetero_infer.kernels.linear_cpu import (
    gated_linear,
    gated_linear_serves,
    packed_linear,
    packed_linear_serves,
)
from hetero_infer.kernels.paged_attention import (
    AttentionMetadata,
    paged_attention_ref,
    prepare_torch_attention,
    store_kv_ref,
)
from hetero_infer.kernels.paged_attention_cpu import paged_attention_cpu, prepare_cpu_attention
from hetero_infer.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from hetero_infer.kernels.rotary import rope_cos_sin, rope_inv_freq, rotary_ref

BACKENDS = ("auto", "torch", "triton")

# A context variable, not a module global: two engines in one process (or the server's
# model thread and a test) can each run under their own backend.
_backend: ContextVar[str] = ContextVar("kernel_backend", default="auto")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run the kernel calls inside under ``name``: "auto", "torch" or "triton"."""
    if name not in BACKENDS:
        raise ValueError(f"kernel backend must be one of {', '.join(BACKENDS)}; got {name!r}")
    token = _backend.set(name)
    try:
        yield
    finally:
        _backend.reset(token)


def current_backend() -> str:
    return _backend.get()


def triton_available() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # e.g. sys.modules["triton"] = None
        return False


def uses_triton(t: torch.Tensor) -> bool:
    """Whether a call on tensor ``t`` runs the Triton kernel under the current backend."""
    backend = _backend.get()
    return backend == "triton" or (backend == "auto" and t.is_cuda)


@functools.cache
def _triton() -> SimpleNamespace:
    if not triton_available():
        raise RuntimeError(
            "the Triton kernels need the triton package (pip install triton); "
            "or use attention_backend='torch'"
        )
    from hetero_infer.kernels.activation_triton import silu_and_mul_triton
    from hetero_infer.kernels.paged_attention_triton import paged_attention_triton, store_kv_triton
    from hetero_infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton
    from hetero_infer.kernels.rotary_triton import rotary_triton

    return SimpleNamespace(
        silu_and_mul=silu_and_mul_triton,
        paged_attention=paged_attention_triton,
        store_kv=store_kv_triton,
        rms_norm=rms_norm_triton,
        fused_add_rms_norm=fused_add_rms_norm_triton,
        rotary=rotary_triton,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [num_tokens, hidden] -> weight * x / rms(x)."""
    if uses_triton(x):
        return _triton().rms_norm(x, weight, eps)
    if cpu := elementwise_kernels(x):
        return cpu.rms_norm(x, weight, eps)
    return rms_norm_ref(x, weight, eps)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    if uses_triton(x):
        return _triton().fused_add_rms_norm(x, residual, weight, eps)
    if cpu := elementwise_kernels(x):
        return cpu.fused_add_rms_norm(x, residual, weight, eps)
    return fused_add_rms_norm_ref(x, residual, weight, eps)


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim]."""
    if uses_triton(q):
        return _triton().rotary(positions, q, k, cos, sin, is_neox)
    if cpu := elementwise_kernels(q):
        return cpu.rotary(positions, q, k, cos, sin, is_neox)
    return rotary_ref(positions, q, k, cos, sin, is_neox)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [rows, in] -> x weight^T + bias: on the CPU in bf16 on a packed copy of the
    weight (kernels/linear_cpu.py); torch's matmul otherwise."""
    if packed_linear_serves(x, weight):
        return packed_linear(x, weight, bias)
    return torch.nn.functional.linear(x, weight, bias)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] -> silu(x[:, :d]) * x[:, d:]."""
    if uses_triton(x):
        return _triton().silu_and_mul(x)
    if cpu := elementwise_kernels(x):
        return cpu.silu_and_mul(x)
    return silu_and_mul_ref(x)


def silu_and_mul_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """silu_and_mul(linear(x, weight, bias)) for a merged gate_up weight [2 * d, in]: on
    the CPU in bf16 in one pass, SiLU-and-mul applied to the fp32 sums before they are
    rounded (kernels/linear_cpu.py)."""
    if gated_linear_serves(x, weight, bias):
        return gated_linear(x, weight)
    return silu_and_mul(linear(x, weight, bias))


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_dim] into their cache slots."""
    if uses_triton(key):
        _triton().store_kv(key, value, k_cache, v_cache, slot_mapping)
    elif key.is_cpu and (cpu := cpu_kernels()):
        cpu.store_kv(key, value, k_cache, v_cache, slot_mapping)
    else:
        store_kv_ref(key, value, k_cache, v_cache, slot_mapping)


def greedy_pick(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] -> (each row's argmax token, its log-softmax value in fp32)."""
    if logits.is_cpu and (cpu := cpu_kernels()):
        return cpu.greedy_pick(logits.contiguous())
    return greedy_pick_ref(logits)


def prepare_attention(
    meta: AttentionMetadata, block_size: int, sliding_windows: set[int | None]
) -> None:
    """Per-step attention set-up shared by all layers: the CPU path's split into decodes
    and prefills, or the torch path's masks. The Triton kernels read the block tables
    directly and need none."""
    if uses_triton(meta.context_lens):
        return
    if meta.context_lens.is_cpu:
        prepare_cpu_attention(meta, block_size, sliding_windows)
    else:
        prepare_torch_attention(meta, block_size, sliding_windows)


def paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """query [num_tokens, num_heads, head_dim] -> output of the same shape."""
    if uses_triton(query):
        return _triton().paged_attention(query, k_cache, v_cache, meta, scale, sliding_window)
    if query.is_cpu:
        return paged_attention_cpu(query, k_cache, v_cache, meta, scale, sliding_window)
    return paged_attention_ref(query, k_cache, v_cache, meta, scale, sliding_window)


__all__ = [
    "BACKENDS",
    "AttentionMetadata",
    "current_backend",
    "fused_add_rms_norm",
    "greedy_pick",
    "linear",
    "paged_attention",
    "prepare_attention",
    "rms_norm",
    "rope_cos_sin",
    "rope_inv_freq",
    "rotary",
    "silu_and_mul",
    "silu_and_mul_linear",
    "store_kv",
    "triton_available",
    "use_backend",
    "uses_triton",
]
