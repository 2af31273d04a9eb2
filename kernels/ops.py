"""The model's ops other than its attention over the KV cache, with their implementations
chosen once.

``KernelOps`` holds one function per op, the torch references unless told otherwise;
kernels/selection.py builds it with the attention backend (as it is on a GPU,
``cpu_ops`` on the CPU, the Triton kernels swapped in by kernels/triton_backend.py) and
the model binds it when it is built. Linear layers are packed once after the weights
load (``pack_linear``), not looked up per call.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from hetero_infer.kernels import decoder_stack_cpu, linear_cpu, linear_quantized, moe_cpu
from hetero_infer.kernels.activation import (
    gelu_tanh_and_mul_ref,
    gelu_tanh_ref,
    silu_and_mul_ref,
)
from hetero_infer.kernels.decoder_stack import DecoderStackFn, DecoderStackSpec, no_decoder_stack
from hetero_infer.kernels.encoder_attention import (
    EncoderAttentionFn,
    cpu_encoder_attention,
    encoder_attention_ref,
)
from hetero_infer.kernels.greedy import greedy_pick_ref
from hetero_infer.kernels.linear import GatedLinear, LinearFn, TorchLinear
from hetero_infer.kernels.linear_choice import LinearChooser
from hetero_infer.kernels.lora import (
    LoRAPart,
    add_lora_ref,
    colocate_lora_ref,
    cpu_lora_ops,
    pack_lora_ref,
)
from hetero_infer.kernels.moe import MoeLayerSpec, no_moe_kernel
from hetero_infer.kernels.philox import uniforms_ref
from hetero_infer.kernels.quantized import QuantizedWeight
from hetero_infer.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from hetero_infer.kernels.rotary import rotary_ref
from hetero_infer.kernels.sampling import SamplingTensors, sample_ref

# The C++ elementwise kernels serve the reduced-precision dtypes; fp32 runs the torch
# references, whose rounding matches transformers' exactly, except for the rotation:
# its C++ kernel rounds each product as torch does, so it is equal to the bit, without
# the ten small torch operators a call (a third of a millisecond a step on a tiny model).
ELEMENTWISE_DTYPES = (torch.bfloat16, torch.float16)
ROTARY_DTYPES = (*ELEMENTWISE_DTYPES, torch.float32)

Tensor = torch.Tensor


def _no_fused_kernel(weight: Tensor, bias: Tensor | None) -> None:
    return None


def _no_quantized_kernel(weight: QuantizedWeight) -> bool:
    return False


@dataclass(frozen=True)
class KernelOps:
    """The model's ops other than its attention over the KV cache; by default the torch
    references (any device)."""

    # x [num_tokens, hidden] -> weight * x / rms(x)
    rms_norm: Callable[[Tensor, Tensor, float], Tensor] = rms_norm_ref
    # (x, residual, weight, eps) -> (rms_norm(x + residual), x + residual)
    fused_add_rms_norm: Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]] = (
        fused_add_rms_norm_ref
    )
    # (positions, q [num_tokens, num_heads, head_dim], k [.., num_kv_heads, ..], cos, sin,
    # is_neox) -> rotated (q, k)
    rotary: Callable[..., tuple[Tensor, Tensor]] = rotary_ref
    # x [num_tokens, 2 * d] -> silu(x[:, :d]) * x[:, d:]
    silu_and_mul: Callable[[Tensor], Tensor] = silu_and_mul_ref
    # x [num_tokens, 2 * d] -> gelu_tanh(x[:, :d]) * x[:, d:] (Gemma's GeGLU)
    gelu_tanh_and_mul: Callable[[Tensor], Tensor] = gelu_tanh_and_mul_ref
    # x (any shape) -> gelu_tanh(x), elementwise (the vision towers' MLP)
    gelu_tanh: Callable[[Tensor], Tensor] = gelu_tanh_ref
    # (q, k, v [segments, heads, length, head_dim], scale) -> [segments, length, heads,
    # head_dim]: attention within each segment (a vision tower's tiles), no mask
    encoder_attention: EncoderAttentionFn = encoder_attention_ref
    # (logits [rows, vocab], with_logprobs) -> (each row's argmax token, its log-softmax
    # value in fp32, or NaN without with_logprobs)
    greedy_pick: Callable[[Tensor, bool], tuple[Tensor, Tensor]] = greedy_pick_ref
    # (logits [rows, vocab], SamplingTensors on their device) -> (tokens [rows], the
    # chosen tokens' logprobs [rows], NaN where not asked): kernels/sampling.py
    sample: Callable[[Tensor, SamplingTensors], tuple[Tensor, Tensor]] = sample_ref
    # (keys [n] int64, counters [n, 2] int64) -> [n] float64 uniforms (kernels/philox.py),
    # on the CPU whatever the device
    uniforms: Callable[[Tensor, Tensor], Tensor] = uniforms_ref
    # (weight [out, in], bias) -> x [..., in] -> [..., out]; the weight may be a
    # QuantizedWeight where takes_quantized says so
    pack_linear: Callable[[Tensor | QuantizedWeight, Tensor | None], LinearFn] = TorchLinear
    # Whether pack_linear takes this quantized weight as it is (else the model
    # dequantizes it at load)
    takes_quantized: Callable[[QuantizedWeight], bool] = _no_quantized_kernel
    # (merged gate_up weight, bias) -> x -> silu_and_mul(linear(x)) in one pass, or None
    # where no kernel fuses the two
    pack_fused_silu_and_mul_linear: Callable[[Tensor, Tensor | None], LinearFn | None] = (
        _no_fused_kernel
    )
    # (A [R, in], parts) -> one adapter's LoRA weights on a projection, packed; and
    # (out [rows, n], x [rows, in], groups[, assign]) -> out plus each adapter's update
    # of its rows (assign: the updates alone), changed in place (kernels/lora.py)
    pack_lora: Callable[[Tensor, list[LoRAPart]], Any] = pack_lora_ref
    add_lora: Callable[..., Tensor] = add_lora_ref
    # One projection's adapters' packed weights, in the order a step reads them, moved
    # next to each other in memory (in place), where the kernel reads them faster so
    colocate_lora: Callable[[list[Any]], None] = colocate_lora_ref
    # The model's layers, packed, -> one call for the steps it serves, or None
    # (kernels/decoder_stack.py)
    pack_decoder_stack: Callable[[DecoderStackSpec], DecoderStackFn | None] = no_decoder_stack
    # A sparse layer's mixture-of-experts block (kernels/moe.py) -> x [tokens, hidden]
    # -> its output, in one call; or None where no kernel takes it (the model then runs
    # its torch reference)
    pack_moe: Callable[[MoeLayerSpec], Callable[[Tensor], Tensor] | None] = no_moe_kernel

    def pack_silu_and_mul_linear(self, weight: Tensor, bias: Tensor | None = None) -> LinearFn:
        """x [..., in] -> silu_and_mul(linear(x)) [..., d] for a merged gate_up weight
        [2 * d, in]: fused where a kernel takes it, else the two ops in turn."""
        fused = self.pack_fused_silu_and_mul_linear(weight, bias)
        if fused is not None:
            return fused
        return GatedLinear(self.pack_linear(weight, bias), self.silu_and_mul, "silu")

    def pack_gelu_tanh_and_mul_linear(self, weight: Tensor, bias: Tensor | None = None) -> LinearFn:
        """x [..., in] -> gelu_tanh_and_mul(linear(x)) [..., d] for a merged gate_up
        weight [2 * d, in]: no kernel fuses these yet."""
        linear = self.pack_linear(weight, bias)
        return GatedLinear(linear, self.gelu_tanh_and_mul, "gelu_pytorch_tanh")

    def replace(self, **changes: Callable) -> KernelOps:
        return dataclasses.replace(self, **changes)


def cpu_ops(module: ModuleType | None, chooser: LinearChooser | None = None) -> KernelOps:
    """CPU tensors: the C++ kernels of ``module`` (kernels/cpu_extension.py) for bf16 and
    fp16, the references for fp32; packed bf16 linear layers (by oneDNN too where
    ``module`` is None: not built, or turned off), and quantized ones where the kernels
    take them. ``chooser``: which of our bf16 kernel and oneDNN runs a projection's rows
    (kernels/linear_choice.py; None: ours wherever it takes the weight)."""
    packed = KernelOps(
        pack_linear=functools.partial(linear_cpu.pack_linear, module=module, chooser=chooser),
    )
    if module is None:
        return packed
    packed = packed.replace(
        takes_quantized=functools.partial(linear_quantized.quantized_kernel_takes, module),
        pack_decoder_stack=functools.partial(decoder_stack_cpu.pack_decoder_stack, module),
        pack_moe=functools.partial(moe_cpu.pack_moe, module),
    )

    def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
        if x.dtype in ELEMENTWISE_DTYPES:
            return module.rms_norm(x, weight, eps)
        return rms_norm_ref(x, weight, eps)

    def fused_add_rms_norm(
        x: Tensor, residual: Tensor, weight: Tensor, eps: float
    ) -> tuple[Tensor, Tensor]:
        if x.dtype in ELEMENTWISE_DTYPES:
            return module.fused_add_rms_norm(x, residual, weight, eps)
        return fused_add_rms_norm_ref(x, residual, weight, eps)

    def rotary(
        positions: Tensor, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, is_neox: bool = True
    ) -> tuple[Tensor, Tensor]:
        if q.dtype in ROTARY_DTYPES:
            return module.rotary(positions, q, k, cos, sin, is_neox)
        return rotary_ref(positions, q, k, cos, sin, is_neox)

    def silu_and_mul(x: Tensor) -> Tensor:
        if x.dtype in ELEMENTWISE_DTYPES:
            return module.silu_and_mul(x)
        return silu_and_mul_ref(x)

    def gelu_tanh(x: Tensor) -> Tensor:
        if x.dtype in ELEMENTWISE_DTYPES and x.is_contiguous():
            return module.gelu_tanh(x)
        return gelu_tanh_ref(x)

    def greedy_pick(logits: Tensor, with_logprobs: bool = True) -> tuple[Tensor, Tensor]:
        # any dtype, in one pass per row
        return module.greedy_pick(logits.contiguous(), with_logprobs)

    def sample(logits: Tensor, tensors: SamplingTensors) -> tuple[Tensor, Tensor]:
        return module.sample(logits.contiguous(), *tensors.fields())

    def uniforms(keys: Tensor, counters: Tensor) -> Tensor:
        return module.philox_uniform(keys, counters)

    pack_lora, add_lora, colocate_lora = cpu_lora_ops(module)
    return packed.replace(
        pack_lora=pack_lora,
        add_lora=add_lora,
        colocate_lora=colocate_lora,
        rms_norm=rms_norm,
        fused_add_rms_norm=fused_add_rms_norm,
        rotary=rotary,
        silu_and_mul=silu_and_mul,
        gelu_tanh=gelu_tanh,
        encoder_attention=cpu_encoder_attention(module),
        pack_fused_silu_and_mul_linear=functools.partial(
            linear_cpu.pack_gated_linear, module=module, chooser=chooser, silu_and_mul=silu_and_mul
        ),
        greedy_pick=greedy_pick,
        sample=sample,
        uniforms=uniforms,
    )
