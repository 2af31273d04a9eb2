"""The Triton kernels as the engine's backend: paged attention, and the elementwise ops.

On a GPU, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, for
tests). This module imports triton, so kernels/selection.py imports it only when the
Triton backend is chosen: the CPU path works without triton installed.
"""

from __future__ import annotations

from hetero_infer.kernels.activation_triton import silu_and_mul_triton
from hetero_infer.kernels.attention_backend import AttentionBackend, AttentionInputs
from hetero_infer.kernels.ops import KernelOps
from hetero_infer.kernels.paged_attention_triton import paged_attention_triton, store_kv_triton
from hetero_infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton
from hetero_infer.kernels.rotary_triton import rotary_triton


def prepare_triton_attention(
    inputs: AttentionInputs, block_size: int, sliding_windows: set[int | None]
) -> AttentionInputs:
    """The kernels read the block tables, context lengths and query starts straight
    from the step's inputs: no metadata beyond them, so a CUDA graph captured over
    static input buffers replays any decode step that fits them."""
    return inputs


def triton_attention() -> AttentionBackend[AttentionInputs]:
    return AttentionBackend(
        "triton",
        prepare_triton_attention,
        store_kv_triton,
        paged_attention_triton,
        supports_cuda_graphs=True,
    )


def triton_ops(device_ops: KernelOps) -> KernelOps:
    """``device_ops`` with the elementwise ops as Triton kernels; the linear layers and
    the greedy pick stay the device's (torch's matmul on a GPU, the packed CPU kernels
    in the interpreter)."""
    return device_ops.replace(
        rms_norm=rms_norm_triton,
        fused_add_rms_norm=fused_add_rms_norm_triton,
        rotary=rotary_triton,
        silu_and_mul=silu_and_mul_triton,
    )
