"""The Triton kernels as the engine's backend: paged attention, the elementwise ops, and
the linear layers on quantized weights.

On a GPU, or on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``, for
tests). This module imports triton, so kernels/selection.py imports it only when the
Triton backend is chosen: the CPU path works without triton installed.
"""

from __future__ import annotations

import torch
from hetero_infer.kernels.activation_triton import silu_and_mul_triton
from hetero_infer.kernels.attention_backend import AttentionBackend, AttentionInputs
from hetero_infer.kernels.linear import LinearFn
from hetero_infer.kernels.linear_planes_triton import planes_linear, planes_triton_takes
from hetero_infer.kernels.linear_quantized_triton import (
    TritonQuantizedLinear,
    triton_quantized_takes,
)
from hetero_infer.kernels.lora_triton import add_lora_triton, pack_lora_triton
from hetero_infer.kernels.moe import MoeLayerSpec
from hetero_infer.kernels.moe_triton import pack_moe_triton
from hetero_infer.kernels.ops import KernelOps
from hetero_infer.kernels.paged_attention_triton import paged_attention_triton
from hetero_infer.kernels.quantized import QuantizedWeight
from hetero_infer.kernels.quantized_planes import PlanarWeight
from hetero_infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton
from hetero_infer.kernels.rotary_triton import rotary_triton
from hetero_infer.kernels.sampling_triton import sample_triton
from hetero_infer.kernels.store_kv_triton import store_kv_triton


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
    """``device_ops`` with the elementwise ops, the sampler and LoRA's updates
    (kernels/lora_triton.py) as Triton kernels, the linear layers on quantized weights
    the Triton kernels take (on a GPU the types kernels/quantized_planes.py holds
    repacked into its planes for kernels/linear_planes_triton.py, the others as the
    file stores them for kernels/linear_quantized_triton.py), and mixture-of-experts
    blocks on float experts (kernels/moe_triton.py); other linear layers and the greedy
    pick stay the
    device's (torch's matmul on a GPU, the packed CPU kernels in the interpreter)."""

    def takes_quantized(weight: QuantizedWeight) -> bool:
        return triton_quantized_takes(weight) or device_ops.takes_quantized(weight)

    def pack_moe(spec: MoeLayerSpec):
        # float experts by the grouped GEMM; quantized ones as the device's ops take them
        return pack_moe_triton(spec) or device_ops.pack_moe(spec)

    def pack_linear(
        weight: torch.Tensor | QuantizedWeight | PlanarWeight, bias: torch.Tensor | None
    ) -> LinearFn:
        if planes_triton_takes(weight):
            return planes_linear(weight, bias)
        if isinstance(weight, QuantizedWeight) and triton_quantized_takes(weight):
            return TritonQuantizedLinear(weight, bias)
        return device_ops.pack_linear(weight, bias)

    return device_ops.replace(
        rms_norm=rms_norm_triton,
        fused_add_rms_norm=fused_add_rms_norm_triton,
        rotary=rotary_triton,
        silu_and_mul=silu_and_mul_triton,
        sample=sample_triton,
        takes_quantized=takes_quantized,
        pack_linear=pack_linear,
        pack_lora=pack_lora_triton,
        add_lora=add_lora_triton,
        pack_moe=pack_moe,
    )
