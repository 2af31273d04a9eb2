"""kernels/gguf_dequantize.py: every type's blocks dequantize in torch to gguf-py's values
bit for bit, on random bytes (every value a file may hold, not only a quantizer's)."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels.gguf_dequantize import TORCH_TYPES
from hetero_infer.kernels.linear_quantized import dequantize_weight

from tests.kernels.test_quantized_linear import raw_weight


@pytest.mark.parametrize("qtype", TORCH_TYPES)
def test_blocks_dequantize_to_gguf_pys_values(qtype):
    weight = raw_weight(qtype, 48, 512)
    expected = weight.dequantize(torch.float32)  # gguf-py's numpy
    assert torch.equal(dequantize_weight(weight, torch.float32), expected)
    assert torch.equal(dequantize_weight(weight, torch.bfloat16), expected.bfloat16())


def test_a_type_without_torch_code_takes_gguf_pys():
    weight = raw_weight("Q5_K", 4, 256)
    assert torch.equal(dequantize_weight(weight, torch.float32), weight.dequantize())
