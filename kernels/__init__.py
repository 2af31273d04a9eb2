"""Kernels the model calls, each with a torch implementation that runs anywhere.

``select_kernels(attention_backend, device, cpu_kernels)`` chooses them once, when an
engine starts (kernels/selection.py), and returns ``Kernels``: an attention backend
(kernels/attention_backend.py: ``prepare`` a step's metadata, ``store_kv``,
``forward``) and ``KernelOps`` for everything else (RMSNorm, RoPE, SiLU-and-mul, linear
layers packed once, the greedy pick). The model is built with them; no call depends
on a per-call context, and the engine's settings come in as arguments (Triton's own
TRITON_INTERPRET aside).

Three families: the torch references (kernels/paged_attention.py, rms_norm.py,
rotary.py, activation.py, greedy.py), the C++ kernels for CPU tensors (kernels/csrc,
loaded by kernels/cpu_extension.py; kernels/paged_attention_cpu.py, ops.py,
linear_cpu.py), and the Triton kernels (kernels/*_triton.py, gathered by
kernels/triton_backend.py). triton is imported only when the Triton backend is chosen,
so the CPU path works without it.
"""

from __future__ import annotations

from hetero_infer.kernels.attention_backend import AttentionBackend, AttentionInputs
from hetero_infer.kernels.linear import LinearFn
from hetero_infer.kernels.ops import KernelOps, cpu_ops
from hetero_infer.kernels.rotary import rope_cos_sin, rope_inv_freq
from hetero_infer.kernels.selection import BACKENDS, Kernels, select_kernels, triton_available

__all__ = [
    "BACKENDS",
    "AttentionBackend",
    "AttentionInputs",
    "KernelOps",
    "Kernels",
    "LinearFn",
    "cpu_ops",
    "rope_cos_sin",
    "rope_inv_freq",
    "select_kernels",
    "triton_available",
]
