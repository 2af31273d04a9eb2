"""The C++ elementwise kernels (bf16/fp16 on the CPU, and the rotation in fp32) against
their torch references, through the ops the engine selects on the CPU."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from hetero_infer.engine.models.mrope import mrope_rows
from hetero_infer.kernels import cpu_ops, select_kernels
from hetero_infer.kernels.activation import gelu_tanh_ref, silu_and_mul_ref
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref
from hetero_infer.kernels.rotary import rope_cos_sin, rope_inv_freq, rotary_ref

from tests.kernels.checks import assert_close, refusals

DTYPES = [torch.bfloat16, torch.float16]
ops = select_kernels("auto", torch.device("cpu")).ops


def randn(*shape: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


class RecordingModule:
    """Stands in for the extension module: notes each kernel the ops reach for."""

    def __init__(self, module: ModuleType) -> None:
        self.module, self.calls = module, []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.module, name)


def test_dispatch_uses_the_kernels_for_reduced_precision_only():
    assert load_cpu_kernels() is not None
    module = RecordingModule(load_cpu_kernels())
    recorded = cpu_ops(module)
    module.calls.clear()  # what building the ops asked (whether a kernel was built)
    for dtype in DTYPES:
        recorded.rms_norm(randn(2, 8, dtype=dtype), randn(8, dtype=dtype), 1e-5)
        recorded.silu_and_mul(randn(2, 8, dtype=dtype))
        recorded.gelu_tanh(randn(2, 8, dtype=dtype))
    assert module.calls == ["rms_norm", "silu_and_mul", "gelu_tanh"] * len(DTYPES)
    # fp32 keeps the references, which round exactly as transformers does, but for the
    # rotation, whose kernel rounds as they do (test_rotary_in_fp32_equals_the_reference).
    module.calls.clear()
    recorded.rms_norm(randn(2, 8, dtype=torch.float32), randn(8, dtype=torch.float32), 1e-5)
    recorded.silu_and_mul(randn(2, 8, dtype=torch.float32))
    recorded.gelu_tanh(randn(2, 8, dtype=torch.float32))
    assert module.calls == []
    cos, sin = rope_cos_sin(rope_inv_freq(8, 10000.0, None), 16)
    q = randn(3, 2, 8, dtype=torch.float32)
    recorded.rotary(torch.arange(3), q, q, cos, sin)
    assert module.calls == ["rotary"]


@pytest.mark.parametrize("eps", [1e-5, 1.0])  # a model's, and one as large as the mean square
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "hidden"), [(1, 64), (37, 576), (300, 96)])
def test_rms_norm(dtype, rows, hidden, eps):
    x = randn(rows, hidden, dtype=dtype)
    weight = randn(hidden, dtype=dtype, seed=1)
    assert_close(ops.rms_norm(x, weight, eps), rms_norm_ref(x, weight, eps), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm(dtype):
    x, residual = randn(45, 128, dtype=dtype), randn(45, 128, dtype=dtype, seed=1)
    weight = randn(128, dtype=dtype, seed=2)
    out, total = ops.fused_add_rms_norm(x, residual, weight, 1e-6)
    out_ref, total_ref = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    assert torch.equal(total, total_ref)  # one rounding of an exact fp32 sum either way
    assert_close(out, out_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 17, 200])
def test_silu_and_mul(dtype, rows):
    x = randn(rows, 2 * 160, dtype=dtype) * 4
    assert_close(ops.silu_and_mul(x), silu_and_mul_ref(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (4, 64, 48), (3, 9000), (1, 4097)])
def test_gelu_tanh(dtype, shape):
    """Any shape, the blocks' ends included (9000 values a row: two whole blocks of 4096
    and a part), and the tails where tanh saturates."""
    x = randn(*shape, dtype=dtype) * 4
    x.view(-1)[:4] = torch.tensor([-100.0, -12.0, 12.0, 100.0])
    assert_close(ops.gelu_tanh(x), gelu_tanh_ref(x), dtype)
    assert torch.equal(ops.gelu_tanh(x).view(-1)[:4], gelu_tanh_ref(x).view(-1)[:4])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_on_views_of_a_merged_projection(dtype, is_neox):
    # q and k are strided views into one [tokens, q + 2 kv] projection, as in the model.
    tokens, heads, kv_heads, head_dim = 23, 6, 2, 20
    qkv = randn(tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.view(tokens, heads, head_dim)
    k = k.view(tokens, kv_heads, head_dim)
    cos, sin = rope_cos_sin(rope_inv_freq(head_dim, 10000.0, None), 4096)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(3))
    q_out, k_out = ops.rotary(positions, q, k, cos, sin, is_neox)
    q_ref, k_ref = rotary_ref(positions, q, k, cos, sin, is_neox)
    assert_close(q_out, q_ref, dtype, "q")
    assert_close(k_out, k_ref, dtype, "k")


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_in_fp32_equals_the_reference(is_neox):
    # Each product rounded before the add, as torch's operators round them: equal to
    # the bit (an FMA, rounding once, differs in the last bit of some values).
    tokens, heads, kv_heads, head_dim = 41, 4, 2, 64
    q, k = (
        randn(tokens, heads, head_dim, dtype=torch.float32),
        randn(tokens, kv_heads, head_dim, dtype=torch.float32, seed=1),
    )
    cos, sin = rope_cos_sin(rope_inv_freq(head_dim, 10000.0, None), 4096)
    positions = torch.randint(0, 4096, (tokens,), generator=torch.Generator().manual_seed(3))
    q_out, k_out = ops.rotary(positions, q, k, cos, sin, is_neox)
    q_ref, k_ref = rotary_ref(positions, q, k, cos, sin, is_neox)
    assert torch.equal(q_out, q_ref) and torch.equal(k_out, k_ref)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.float32])
def test_rotary_on_m_ropes_tables_of_each_token(dtype):
    """M-RoPE (Qwen2.5-VL) gathers each token's cos and sin rows from the tables by its
    three positions; the kernel takes them as tables with token i at row i."""
    tokens, head_dim = 9, 16
    cos, sin = rope_cos_sin(rope_inv_freq(head_dim, 10000.0, None), 64)
    positions = torch.randint(0, 64, (3, tokens), generator=torch.Generator().manual_seed(4))
    rows = mrope_rows((cos, sin), positions, (2, 3, 3))
    q, k = randn(tokens, 2, head_dim, dtype=dtype), randn(tokens, 1, head_dim, dtype=dtype)
    at_row = torch.arange(tokens)
    q_out, k_out = ops.rotary(at_row, q, k, *rows)
    q_ref, k_ref = rotary_ref(at_row, q, k, *rows)
    assert_close(q_out, q_ref, dtype, "q")
    assert_close(k_out, k_ref, dtype, "k")


def z(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype)


def rotary(module: ModuleType, **changed: torch.Tensor) -> Any:
    """The rotary kernel on 3 tokens of 2 heads of 8 and a table of 16 positions, with
    ``changed`` arguments."""
    table = z(16, 8, dtype=torch.float32)
    args = {"positions": torch.arange(3), "q": z(3, 2, 8), "k": z(3, 2, 8), "cos": table}
    args = {**args, "sin": table, **changed}  # in the kernel's order
    return module.rotary(*args.values(), True)


# Per kernel's check, its message and calls whose arguments each break it in one way
# (rows of 8 bf16 values).
FP32 = torch.float32
ELEMENTWISE_REFUSALS = {
    r"x must be a contiguous \[rows, hidden\]": {
        "rms_norm 1-d": lambda m: m.rms_norm(z(8), z(8), 1e-5),
        "rms_norm strided": lambda m: m.rms_norm(z(2, 16)[:, ::2], z(8), 1e-5),
    },
    r"weight must be \[hidden\] in x's dtype": {
        "rms_norm fp32 weight": lambda m: m.rms_norm(z(2, 8), z(8, dtype=FP32), 1e-5),
        "rms_norm short weight": lambda m: m.rms_norm(z(2, 8), z(7), 1e-5),
    },
    "residual must match x": {
        "other shape": lambda m: m.fused_add_rms_norm(z(2, 8), z(3, 8), z(8), 1e-5),
        "strided": lambda m: m.fused_add_rms_norm(z(2, 8), z(2, 16)[:, ::2], z(8), 1e-5),
        "other dtype": lambda m: m.fused_add_rms_norm(z(2, 8), z(2, 8, dtype=FP32), z(8), 1e-5),
    },
    r"x must be a contiguous \[rows, 2 \* d\]": {
        "silu 1-d": lambda m: m.silu_and_mul(z(8)),
        "silu strided": lambda m: m.silu_and_mul(z(2, 16)[:, ::2]),
        "silu odd width": lambda m: m.silu_and_mul(z(2, 7)),
    },
    "x must be contiguous": {"gelu strided": lambda m: m.gelu_tanh(z(2, 16)[:, ::2])},
    "positions must be contiguous int64": {
        "int32 positions": lambda m: rotary(m, positions=torch.arange(3).int()),
        "strided positions": lambda m: rotary(m, positions=torch.arange(6)[::2]),
    },
    r"cos/sin must be contiguous fp32 \[max_positions, head_dim\]": {
        "fp16 cos": lambda m: rotary(m, cos=z(16, 8, dtype=torch.half)),
        "strided cos": lambda m: rotary(m, cos=z(16, 16, dtype=FP32)[:, ::2]),
        "strided sin": lambda m: rotary(m, sin=z(16, 16, dtype=FP32)[:, ::2]),
        "other head_dim": lambda m: rotary(m, cos=z(16, 4, dtype=FP32)),
    },
    r"q/k must be \[tokens, heads, head_dim\] with contiguous heads": {
        "2-d k": lambda m: rotary(m, k=z(3, 8)),
        "strided q": lambda m: rotary(m, q=z(3, 2, 16)[..., ::2]),
        "q heads apart": lambda m: rotary(m, q=z(3, 2, 10)[..., :8]),
    },
}


@pytest.mark.parametrize(("call", "message"), refusals(ELEMENTWISE_REFUSALS))
def test_kernels_refuse_tensors_they_cannot_read(call, message):
    with pytest.raises(RuntimeError, match=message):
        call(load_cpu_kernels())
    rotary(load_cpu_kernels())  # as the kernel takes them
