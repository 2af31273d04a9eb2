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

import importlib
from typing import Any

if __name__ == "kernels":  # found under Hugging Face's package's name: kernels/bare_name.py
    from hetero_infer.kernels.bare_name import load_installed_package

    load_installed_package(__path__[0])

from hetero_infer.kernels.backends import BACKENDS

# Names the package exports -> the module that has them, imported on first use: the
# engine's config reads BACKENDS before torch may load (see process_settings.py), and
# importing this package must not load torch for it.
_EXPORTS = {
    "AttentionBackend": "attention_backend",
    "AttentionInputs": "attention_backend",
    # the torch reference's, for a step the kernels do not serve (bidirectional_ends)
    "torch_attention": "paged_attention",
    "LinearFn": "linear",
    "KernelOps": "ops",
    "cpu_ops": "ops",
    "rope_cos_sin": "rotary",
    "rope_inv_freq": "rotary",
    "rope_tables": "rotary",
    "partial_rotary_order": "rotary",
    "Kernels": "selection",
    # which of our bf16 linear kernel and oneDNN runs a projection's rows (measured)
    "LinearChooser": "linear_choice",
    "select_kernels": "selection",
    # an image's preprocessing as transformers' PIL-based processors, on the CPU kernels
    "resize_like_pillow": "image_cpu",
    "pixel_levels": "image_cpu",
    "with_padding": "image_cpu",
    "triton_available": "selection",
    # the decoder stack's description, which the model gives and the kernels pack
    "DecoderLayerSpec": "decoder_stack",
    "DecoderStackSpec": "decoder_stack",
    "MoeLayerSpec": "moe",
    "DecoderStackFn": "decoder_stack",
    "unfused": "linear",
    "GatedLinear": "linear",
    # LoRA's updates of a step's rows, grouped by adapter
    "LoRAGroup": "lora",
    "add_lora_ref": "lora",
    "pack_lora_ref": "lora",
    # how the KV cache stores keys and values (kv_cache_dtype)
    "KV_FORMAT": "kv_quant",
    "kv_cache_torch_dtype": "kv_quant",
    "stored_head_size": "kv_quant",
    # quantized weights, as the loaders read them and the linear layers keep them
    "QuantizedWeight": "quantized",
    "PlanarWeight": "quantized_planes",
    "GGUF_TYPES": "quantized",
    "INT8": "quantized",
    "concat_rows": "quantized",
    "quantize_int8": "quantized",
    "dequantize_rows": "linear_quantized",
    "dequantize_weight": "linear_quantized",
    "DEQUANTIZE_ROWS_TYPES": "linear_quantized",
    # sampling's tensors and the torch references the sampler and verifiers run
    "SamplingTensors": "sampling",
    "process_logits_ref": "sampling",
    "sample_ref": "sampling",
    "truncated_weights_ref": "sampling",
    "draw_ref": "sampling",
    "greedy_pick_ref": "greedy",
    # what the CPU computes in, for the engine's default dtype
    "has_bf16_matmul": "cpu_isa",
    "kernel_unavailable": "cpu_isa",
}

__all__ = ["BACKENDS", *_EXPORTS]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
