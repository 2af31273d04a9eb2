"""Attention within an encoder's segments (kernels/encoder_attention.py): the C++ kernel
for fp32's small heads against torch's scaled_dot_product_attention, on the views a
vision tower's merged projection gives; every other case left to the reference."""

from __future__ import annotations

import pytest
import torch
from hetero_infer.kernels import cpu_ops
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.encoder_attention import encoder_attention_ref

needs_kernel = pytest.mark.cpu_kernels("encoder_attention")


def merged_views(
    segments: int, length: int, heads: int, head_dim: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """q, k, v [segments, heads, length, head_dim] as SigLIP takes them from its merged
    projection's output: strided views, each token's q, k and v side by side."""
    hidden = heads * head_dim
    qkv = torch.randn(segments, length, 3 * hidden, generator=torch.Generator().manual_seed(7))
    return tuple(
        part.view(segments, length, heads, head_dim).transpose(1, 2)
        for part in qkv.to(dtype).split(hidden, -1)
    )


class Recording:
    """The extension, noting whether encoder_attention was called."""

    def __init__(self) -> None:
        self.module, self.calls = load_cpu_kernels(), 0

    def __getattr__(self, name: str):
        if name == "encoder_attention":
            self.calls += 1
        return getattr(self.module, name)


@needs_kernel
@pytest.mark.parametrize(
    ("segments", "length", "heads", "head_dim"),
    [(13, 64, 4, 8), (3, 24, 2, 16), (2, 40, 3, 32), (1, 8, 1, 8), (5, 72, 2, 16)],
)
def test_the_kernel_equals_the_reference(segments, length, heads, head_dim):
    q, k, v = merged_views(segments, length, heads, head_dim)
    module = Recording()
    out = cpu_ops(module).encoder_attention(q, k, v, head_dim**-0.5)
    assert module.calls == 1
    expected = encoder_attention_ref(q, k, v, head_dim**-0.5)
    assert out.shape == (segments, length, heads, head_dim) and out.is_contiguous()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@needs_kernel
@pytest.mark.parametrize(
    ("length", "head_dim", "dtype"),
    [(64, 64, torch.float32), (20, 8, torch.float32), (64, 16, torch.bfloat16)],
    ids=["head_dim 64", "length not of 8", "bf16"],
)
def test_other_sizes_and_dtypes_take_the_reference(length, head_dim, dtype):
    q, k, v = merged_views(2, length, 2, head_dim, dtype)
    module = Recording()
    out = cpu_ops(module).encoder_attention(q, k, v, 0.3)
    assert module.calls == 0
    assert torch.equal(out, encoder_attention_ref(q, k, v, 0.3))


@needs_kernel
def test_the_kernel_checks_its_inputs():
    q, k, v = merged_views(2, 16, 2, 8)
    with pytest.raises(RuntimeError, match="head_dim 8, 16 or 32"):
        load_cpu_kernels().encoder_attention(*merged_views(2, 16, 1, 64), 1.0)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        load_cpu_kernels().encoder_attention(*merged_views(2, 12, 2, 8), 1.0)
    with pytest.raises(RuntimeError, match="alike"):
        load_cpu_kernels().encoder_attention(q, k[:, :1], v, 1.0)
    for i in range(3):  # q, k or v in bf16
        args = [q, k, v]
        args[i] = args[i].bfloat16()
        with pytest.raises(RuntimeError, match="fp32 q, k and v"):
            load_cpu_kernels().encoder_attention(*args, 1.0)
    strided = torch.zeros(2, 2, 16, 16)[..., ::2]  # values 2 apart within a row
    for i in range(3):
        args = [q, k, v]
        args[i] = strided
        with pytest.raises(RuntimeError, match="rows of contiguous values"):
            load_cpu_kernels().encoder_attention(*args, 1.0)
    apart = torch.zeros(2, 2, 16, 16)[..., :8]  # rows 16 apart, where v's are 48 apart
    with pytest.raises(RuntimeError, match="k's and v's rows equally apart"):
        load_cpu_kernels().encoder_attention(q, apart, v, 1.0)
