"""Quantized weights kept as they are stored: the type every quantized kernel takes.

A GGUF file's quantized tensor stays in its own blocks (llama.cpp's layout: each row of
``in_features`` values is a run of blocks, so rows are independent and can be permuted
or concatenated as bytes); a weight-only int8 weight is int8 values with one scale per
output row (the compressed-tensors layout vLLM and SGLang load). ``dequantize`` is the
reference every kernel is checked against: gguf-py's own dequantization for the GGUF
types, scale times value for int8.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# GGUF block types kept quantized, by their GGML names: all that a file downloaded as
# Q4_K_M or Q5_K_M holds (llama.cpp stores a K-quant's tensor whose rows are not whole
# 256-value super-blocks as Q5_0, Q5_1 or Q8_0 instead).
GGUF_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# Weight-only int8, one fp32 scale per output row.
INT8 = "I8"
QUANT_TYPES = (*GGUF_TYPES, INT8)


@dataclass(frozen=True)
class QuantizedWeight:
    qtype: str  # one of QUANT_TYPES
    # GGUF types: uint8 [out_features, row_bytes], the file's blocks as they are.
    # INT8: int8 [out_features, in_features].
    data: torch.Tensor
    shape: tuple[int, int]  # (out_features, in_features)
    # INT8 only: fp32 [out_features], the value of one step of each row.
    scales: torch.Tensor | None = None
    # What a kernel that quantizes the activations (the CPU's, per block of 32 values)
    # rounds them to: 8 or 16 bits (ModelConfig.quantized_activation_bits: 16 for a model
    # whose activations have outlier channels, which leave a block's other values few
    # of int8's steps). Kernels that multiply float activations ignore it.
    activation_bits: int = 8

    def __post_init__(self) -> None:
        assert self.qtype in QUANT_TYPES, self.qtype
        assert self.activation_bits in (8, 16), self.activation_bits
        assert self.data.shape[0] == self.shape[0]
        if self.qtype == INT8:
            assert self.data.dtype == torch.int8 and self.scales is not None
        else:
            assert self.data.dtype == torch.uint8 and self.data.shape[1] == row_bytes(
                self.qtype, self.shape[1]
            )

    @property
    def nbytes(self) -> int:
        scales = self.scales.numel() * self.scales.element_size() if self.scales is not None else 0
        return self.data.numel() * self.data.element_size() + scales

    def rows(self, index: torch.Tensor | slice) -> QuantizedWeight:
        """The weight of some output rows (row blocks are independent)."""
        data = self.data[index]
        scales = self.scales[index] if self.scales is not None else None
        shape = (data.shape[0], self.shape[1])
        return QuantizedWeight(self.qtype, data, shape, scales, self.activation_bits)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """[out_features, in_features] in ``dtype``: the reference values."""
        if self.qtype == INT8:
            return (self.data.float() * self.scales.float()[:, None]).to(dtype)
        import gguf

        qtype = gguf.GGMLQuantizationType[self.qtype]
        values = gguf.quants.dequantize(self.data.cpu().numpy(), qtype)
        return torch.from_numpy(np.ascontiguousarray(values)).reshape(self.shape).to(dtype)


def quantize_int8(weight: torch.Tensor) -> QuantizedWeight:
    """A float weight [out, in] as weight-only int8, symmetric per output row (what
    compressed-tensors' W8A16 scheme stores): scale = the row's largest magnitude / 127,
    values rounded to the nearest step. The scales are computed in fp32 from the given
    weight, so quantizing a bf16 checkpoint sees its own values."""
    w = weight.float()
    scales = w.abs().amax(dim=1) / 127.0
    steps = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero row
    values = torch.round(w / steps[:, None]).clamp_(-127, 127).to(torch.int8)
    return QuantizedWeight(INT8, values, tuple(weight.shape), scales)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight | None:
    """The parts stacked along the output rows (e.g. q, k, v into one qkv weight), or
    None where their types differ (a Q4_K_M file mixes Q4_K and Q6_K)."""
    first = parts[0]
    if any(
        p.qtype != first.qtype
        or p.shape[1] != first.shape[1]
        or p.activation_bits != first.activation_bits
        for p in parts
    ):
        return None
    data = torch.cat([p.data for p in parts])
    scales = torch.cat([p.scales for p in parts]) if first.scales is not None else None
    shape = (data.shape[0], first.shape[1])
    return QuantizedWeight(first.qtype, data, shape, scales, first.activation_bits)


def row_bytes(qtype: str, in_features: int) -> int:
    """Bytes of one row of ``in_features`` values in a GGUF block type."""
    import gguf

    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    assert in_features % block_size == 0, (qtype, in_features)
    return in_features // block_size * type_size
