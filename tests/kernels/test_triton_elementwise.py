"""Triton RMSNorm, RoPE and SiLU-and-mul against the torch references (interpreter).

The references run in the same dtype: they define the rounding the model sees.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hetero_infer.kernels.activation import silu_and_mul_ref  # noqa: E402
from hetero_infer.kernels.activation_triton import silu_and_mul_triton  # noqa: E402
from hetero_infer.kernels.rms_norm import fused_add_rms_norm_ref, rms_norm_ref  # noqa: E402
from hetero_infer.kernels.rms_norm_triton import fused_add_rms_norm_triton, rms_norm_triton  # noqa: E402
from hetero_infer.kernels.rotary import rope_cos_sin, rope_inv_freq, rotary_ref  # noqa: E402
from hetero_infer.kernels.rotary_triton import rotary_triton  # noqa: E402
from hetero_infer.kernels.triton_utils import DeviceInfo  # noqa: E402

from tests.kernels.checks import assert_close, strided  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = ["fp32", "fp16", "bf16"]
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.fixture(autouse=True, params=["one-program", "small-tiles"])
def tiles(request, monkeypatch):
    """Run each case with the interpreter's one big tile, and with tiles of 256 elements
    so that rows (and columns) spread over several programs, as on a GPU."""
    if request.param == "small-tiles":
        monkeypatch.setattr(DeviceInfo, "max_tile", property(lambda self: 256))


def strided_rows(num_rows: int, width: int, dtype: torch.dtype, gen: torch.Generator):
    """[num_rows, width] as a view of a wider tensor: a row stride != width."""
    wide = torch.randn(num_rows, width + 8, generator=gen).to(dtype)
    return wide[:, 3 : 3 + width]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("num_rows,hidden", [(1, 64), (7, 72), (33, 576), (5, 1000)])
def test_rms_norm(dtype, num_rows, hidden):
    gen = torch.Generator().manual_seed(hidden)
    x = strided_rows(num_rows, hidden, dtype, gen)
    residual = torch.randn(num_rows, hidden, generator=gen).to(dtype)
    weight = torch.randn(hidden, generator=gen).to(dtype)
    assert_close(rms_norm_triton(x, weight, 1e-5), rms_norm_ref(x, weight, 1e-5), dtype, "norm")
    out, new_residual = fused_add_rms_norm_triton(x, residual, weight, 1e-6)
    expected_out, expected_residual = fused_add_rms_norm_ref(x, residual, weight, 1e-6)
    if dtype == torch.bfloat16:  # the interpreter truncates fp32 -> bf16
        assert_close(new_residual, expected_residual, dtype, "residual")
    else:  # one rounded add: bit-exact
        assert torch.equal(new_residual, expected_residual)
    assert_close(out, expected_out, dtype, "fused add + norm")


def test_rms_norm_fp32_weight_promotes_like_the_reference():
    x = torch.randn(3, 40).half()
    weight = torch.randn(40)
    out = rms_norm_triton(x, weight, 1e-5)
    assert out.dtype == torch.float32
    assert_close(out, rms_norm_ref(x, weight, 1e-5), torch.float16)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("is_neox", [True, False], ids=["neox", "gptj"])
@pytest.mark.parametrize(
    "num_tokens,num_heads,num_kv_heads,head_dim", [(5, 4, 2, 12), (9, 3, 1, 24), (3, 8, 8, 128)]
)
def test_rotary(dtype, is_neox, num_tokens, num_heads, num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(head_dim)
    inv_freq = rope_inv_freq(head_dim, 500000.0, LLAMA3)
    cos, sin = rope_cos_sin(inv_freq, 300)
    positions = torch.randint(0, 300, (num_tokens,), generator=gen)
    positions[0] = 0
    # q and k as the model passes them: views into one merged qkv projection
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * kv_size, generator=gen).to(dtype)
    q = qkv[:, :q_size].view(num_tokens, num_heads, head_dim)
    k = qkv[:, q_size : q_size + kv_size].view(num_tokens, num_kv_heads, head_dim)
    out_q, out_k = rotary_triton(positions, q, k, cos, sin, is_neox)
    expected_q, expected_k = rotary_ref(positions, q, k, cos, sin, is_neox)
    assert_close(out_q, expected_q, dtype, "q")
    assert_close(out_k, expected_k, dtype, "k")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("num_rows,d", [(1, 7), (13, 112), (4, 5000)])
def test_silu_and_mul(dtype, num_rows, d):
    gen = torch.Generator().manual_seed(d)
    x = strided_rows(num_rows, 2 * d, dtype, gen)
    assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), dtype)


def test_rms_norm_where_its_epsilon_counts():
    """Rows near zero, where the epsilon under the root is most of the mean square."""
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(3, 64, generator=gen) * 1e-3 for _ in range(2))
    weight = torch.randn(64, generator=gen)
    expected = rms_norm_ref(x, weight, 1e-5)
    assert_close(rms_norm_triton(x, weight, 1e-5), expected, torch.float32)
    assert not torch.allclose(expected, rms_norm_ref(x, weight, 0.0), rtol=0.1)
    fused = fused_add_rms_norm_triton(x, residual, weight, 1e-5)[0]
    assert_close(fused, fused_add_rms_norm_ref(x, residual, weight, 1e-5)[0], torch.float32)


@pytest.mark.parametrize(
    "call",
    [
        lambda x, w: silu_and_mul_triton(x[:, :63]),
        lambda x, w: rms_norm_triton(x, w[:63], 1e-5),
        lambda x, w: rms_norm_triton(x, strided(w), 1e-5),
        lambda x, w: fused_add_rms_norm_triton(x, x[:2], w, 1e-5),
        lambda x, w: fused_add_rms_norm_triton(x, x.double(), w, 1e-5),
    ],
    ids=["odd width", "short weight", "strided weight", "residual rows", "residual dtype"],
)
def test_shapes_the_kernels_cannot_take_are_refused(call):
    x, weight = torch.ones(3, 64), torch.ones(64)
    with pytest.raises(AssertionError):
        call(x, weight)


def rotary_inputs(num_tokens: int) -> tuple[torch.Tensor, ...]:
    """positions, q [tokens, 4, 16], k [tokens, 2, 16], cos and sin for 32 positions."""
    gen = torch.Generator().manual_seed(num_tokens)
    cos, sin = rope_cos_sin(rope_inv_freq(16, 10000.0, None), 32)
    positions = torch.randint(0, 32, (num_tokens,), generator=gen)
    q, k = (
        torch.randn(num_tokens, 4, 16, generator=gen),
        torch.randn(num_tokens, 2, 16, generator=gen),
    )
    return positions, q, k, cos, sin


def test_rotary_of_one_token_defaults_to_neox():
    """A decode step's single token, the layout not named (as the kernels' callers leave
    it for the neox layout)."""
    inputs = rotary_inputs(1)
    for out, expected in zip(rotary_triton(*inputs), rotary_ref(*inputs, True), strict=True):
        assert_close(out, expected, torch.float32)


@pytest.mark.parametrize(
    "case",
    [
        "sin of other positions",
        "tables of other widths",
        "a position too many",
        "strided positions",
    ],
)
def test_rotary_refuses_tables_and_positions_that_do_not_fit(case):
    positions, q, k, cos, sin = rotary_inputs(3)
    match case:
        case "sin of other positions":
            sin = sin[:16]
        case "tables of other widths":
            cos, sin = cos[:, :8].contiguous(), sin[:, :8].contiguous()
        case "a position too many":
            positions = torch.cat([positions, positions[:1]])
        case "strided positions":
            positions = strided(positions)
    with pytest.raises(AssertionError):
        rotary_triton(positions, q, k, cos, sin)
