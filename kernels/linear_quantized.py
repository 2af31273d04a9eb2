"""Linear layers on quantized weights kept in their blocks, on the CPU.

A weight stays in the file's blocks (kernels/quantized.py; weight-only int8 is taken as
Q8_0 with one fp32 scale per row instead of per block), repacked once at load by
``pack_quantized_weight`` (kernels/csrc/quantized_linear_cpu.cpp) into panels of 16
outputs of the same bytes: a decode step, bound by memory bandwidth, streams 0.625 bytes
per weight for Q4_1 and 1.0625 for Q8_0 instead of bf16's 2 (Q4_0 0.5625, Q4_K 0.578,
Q5_0 0.6875, Q5_K 0.703, Q5_1 0.75, Q6_K 0.82). The kernel quantizes each activation row
per block of 32 values to int8, or to 16 bits for a model with outlier channels
(QuantizedWeight.activation_bits; ``quantize_activations`` is its reference), and
multiplies integers on AVX512-VNNI, or on AVX2 where the CPU lacks it (the same integer
sums); ``quantized_linear_ref`` is the product it computes, in fp64. On SmolLM2's
projections it ran 1.9x (Q8_0) to 2.9x (Q4_0, Q4_1) the bf16 kernel's speed at 1 row and
1.3-1.5x at 128-512 rows (Q6_K: 0.9x there); the C++ file says why int8 and how.

``dequantize_rows`` looks up a few rows of a quantized embedding (the token
embedding, whose rows a step gathers) without dequantizing the whole table.
"""

from __future__ import annotations

from types import ModuleType

import torch
from hetero_infer.kernels.gguf_dequantize import BLOCK_VALUES, TORCH_TYPES, dequantize_blocks
from hetero_infer.kernels.quantized import INT8, QuantizedWeight
from hetero_infer.kernels.quantized_planes import PlanarWeight, unpack_planes

# The types quantized_linear takes (the K-quants: rows of a multiple of 256).
KERNEL_TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", INT8)
# The activations' dtypes the kernel takes; others are computed in fp32.
KERNEL_DTYPES = (torch.bfloat16, torch.float32)
# The GGUF types dequantize_rows takes: in torch (TORCH_TYPES), Q5_K through gguf-py's
# dequantization of the rows looked up.
DEQUANTIZE_ROWS_TYPES = (*TORCH_TYPES, "Q5_K")
BLOCK = 32  # values per block, weights and activations alike
PANEL = 16  # outputs per packed panel
# The largest quantized magnitude per activation width (QuantizedWeight.activation_bits):
# a block's largest value sets its step, amax / 127 or amax / 32639. 16 bits stop at
# 127 x 257, so that the kernel's high byte of each value, (v + 128) >> 8, fits in an
# int8.
ACTIVATION_LEVELS = {8: 127.0, 16: 32639.0}


# Rows from which a call may run on AMX's bf16 tiles over the weight dequantized
# (QuantizedLinear's bf16_tiles): on a Xeon with AMX (2 threads, SmolLM2's Q4_1 shapes)
# 1.26-1.48x the int8 kernels' speed at 32 rows, 1.6-1.95x at 64, 2.0-2.7x at 256 and
# 2.4-3.4x at 2,048; at 16 rows 0.80-1.00x.
BF16_TILES_FROM = 32


class QuantizedLinear:
    """x [..., in] @ weight^T + bias by the quantized kernel, on the weight's blocks
    repacked into the kernel's panels; the result in x's dtype (bf16 and fp32 as they
    are, fp16 through fp32), x quantized per block of 32 values to the weight's
    ``activation_bits``. ``bf16_tiles``: calls of BF16_TILES_FROM rows and more run on
    AMX's bf16 tiles instead, the weight dequantized to bf16 a few panels at a time and
    x rounded to bf16 (where the CPU has the tiles): faster on prompts, but a row's
    result then depends on the rows it shares a call with."""

    def __init__(
        self,
        module: ModuleType,
        weight: QuantizedWeight,
        bias: torch.Tensor | None = None,
        bf16_tiles: bool = False,
    ) -> None:
        self.qtype = weight.qtype
        self.activation_bits = weight.activation_bits
        # [out / 16, bytes]; int8 rows go in as their bytes, with their scales
        data = weight.data.view(torch.uint8)
        self.packed = module.pack_quantized_weight(data, weight.qtype, weight.scales)
        self.run = module.quantized_linear
        # The kernel adds the bias in fp32: converted once here, not per call.
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features = weight.shape[0]
        self.bf16_tiles = module.quantized_linear_bf16 if bf16_tiles else None
        self.bf16_tiles_ready = module.quantized_linear_bf16_ready  # AMX's switch, as it is

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if (
            self.bf16_tiles is not None
            and len(rows) >= BF16_TILES_FROM
            and x.dtype in KERNEL_DTYPES
            and self.bf16_tiles_ready()
        ):
            out = self.bf16_tiles(rows, self.packed, self.qtype, self.bias)
        elif x.dtype in KERNEL_DTYPES:
            out = self.run(rows, self.packed, self.qtype, self.bias, self.activation_bits)
        else:
            out = self.run(
                rows.float(), self.packed, self.qtype, self.bias, self.activation_bits
            ).to(x.dtype)
        return out.view(*x.shape[:-1], self.out_features)


def quantized_kernel_takes(module: ModuleType | None, weight: QuantizedWeight) -> bool:
    """Whether the quantized kernel takes this weight: the kernels are built (a build
    only loads on a CPU with the instructions it was compiled for) with AVX2 and FMA,
    the type is one of KERNEL_TYPES, the weight is on the CPU and its output count a
    multiple of 16 (whole panels)."""
    return (
        module is not None
        and module.quantized_linear_available()
        and weight.qtype in KERNEL_TYPES
        and weight.data.is_cpu
        and weight.shape[0] % PANEL == 0
        and weight.shape[1] % BLOCK == 0
    )


def quantize_activations(x: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (integer values [M, K], int8 or int16, fp32 scales [M, K / 32]):
    what the kernel multiplies the weight with, in plain torch (its reference). Per
    block of 32, with L = ACTIVATION_LEVELS[bits]: q = round-half-even(x * (L / amax)),
    scale = amax / L (0 for a zero block)."""
    levels = ACTIVATION_LEVELS[bits]
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # A tensor divided by a tensor: torch computes ``127.0 / amax`` as amax's
    # reciprocal times 127, rounded twice, and then ties round differently.
    inverse = torch.where(amax > 0, torch.full_like(amax, levels) / amax, torch.zeros_like(amax))
    dtype = torch.int8 if bits == 8 else torch.int16
    values = torch.round(blocks * inverse).to(dtype).reshape(x.shape)
    return values, (amax / levels).squeeze(-1)


def quantized_linear_ref(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """What the kernel computes, in fp64: the activations quantized as the kernel does
    them (quantize_activations, to the weight's activation_bits) times gguf-py's
    dequantized weight, plus the bias."""
    values, scales = quantize_activations(x, weight.activation_bits)
    dequantized = values.double().reshape(x.shape[0], -1, BLOCK) * scales.double()[..., None]
    out = dequantized.reshape(x.shape) @ weight.dequantize(torch.float64).T
    return out if bias is None else out + bias.double()


def dequantize_weight(weight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The whole weight [out, in] in ``dtype``, as the loaders dequantize a file's
    blocks: in torch where kernels/gguf_dequantize.py has the type, else by gguf-py."""
    if weight.qtype in TORCH_TYPES:
        return dequantize_rows(weight, torch.arange(weight.shape[0]), dtype)
    return weight.dequantize(dtype)


def dequantize_rows(
    weight: QuantizedWeight | PlanarWeight, ids: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Rows ``ids`` of a weight [out, in] of DEQUANTIZE_ROWS_TYPES -> [*ids.shape, in] in
    ``dtype``, from their blocks alone (an embedding lookup)."""
    if isinstance(weight, PlanarWeight):
        # The GPU's planes (a tied lm_head's): the rows looked up back in the file's
        # blocks, a step's few rather than a second copy of the table.
        flat = ids.reshape(-1)
        rows = unpack_planes(weight.rows(flat))
        order = torch.arange(flat.numel(), device=flat.device).reshape(ids.shape)
        return dequantize_rows(rows, order, dtype)
    assert weight.qtype in DEQUANTIZE_ROWS_TYPES, weight.qtype
    if weight.qtype not in TORCH_TYPES:
        # numpy: ~0.1 ms for a decode step's row, ~16 ms for 512 rows of 512 values (the
        # price of an lm_head that reads 5.5 bits a weight instead of bf16's 16).
        if ids.numel() == 0:
            return torch.empty(*ids.shape, weight.shape[1], dtype=dtype, device=weight.data.device)
        rows = weight.rows(ids.reshape(-1).to(weight.data.device)).dequantize(dtype)
        return rows.to(weight.data.device).reshape(*ids.shape, weight.shape[1])
    per_row = weight.shape[1] // BLOCK_VALUES[weight.qtype]  # blocks per row
    rows = weight.data[ids.reshape(-1)]
    blocks = rows.reshape(ids.numel() * per_row, weight.data.shape[1] // per_row)
    values = dequantize_blocks(weight.qtype, blocks)
    return values.reshape(*ids.shape, weight.shape[1]).to(dtype)
