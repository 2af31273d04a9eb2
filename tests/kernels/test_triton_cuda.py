"""The Triton kernels compiled for an NVIDIA GPU, against their torch references: the
interpreter tests' own cases (test_triton_attention.py, test_triton_elementwise.py),
with bf16 attention and the tiles the GPU picks beside them, and the linear layer on
quantized weights for every type it reads.

``make gpu-check`` runs the tests marked cuda with TRITON_INTERPRET=0, so that they check
what the GPU runs, not what the interpreter makes of it. Inputs are built on the CPU as
the interpreter tests build them and the references run there; only the launchers run
on the GPU, wrapped by ``on_device`` (tensors copied with their strides, in-place writes
copied back, results brought back). One small case of each check runs through the same
wrapping on the CPU, in the interpreter, so that this file's code runs on every machine.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

from hetero_infer.kernels.linear_quantized_triton import quantized_linear_triton  # noqa: E402
from hetero_infer.kernels.paged_attention_triton import AttentionTiles, choose_tiles  # noqa: E402
from hetero_infer.kernels.triton_utils import device_info, interpreting  # noqa: E402

from tests.kernels import test_linear_quantized_triton as quantized  # noqa: E402
from tests.kernels import test_lora_kernels as lora  # noqa: E402
from tests.kernels import test_moe_triton as moe  # noqa: E402
from tests.kernels import test_triton_attention as attention  # noqa: E402
from tests.kernels import test_triton_elementwise as elementwise  # noqa: E402
from tests.kernels.batches import make_batch  # noqa: E402
from tests.kernels.batches import quantized as quantized_cache  # noqa: E402
from tests.kernels.checks import assert_close  # noqa: E402
from tests.kernels.test_quantized_linear import randn  # noqa: E402

DTYPES, DTYPE_IDS = elementwise.DTYPES, elementwise.DTYPE_IDS

# ---- running the launchers on a device ----


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` on ``device``: a tensor with its strides (a view becomes the same view of
    a copy of its base, where Tensor.to would make it contiguous), a dataclass with its
    tensor fields moved (attention inputs, a quantized weight); anything else as it is."""
    if isinstance(value, torch.Tensor):
        base = value if value._base is None else value._base
        assert base.is_contiguous() and base.storage_offset() == 0, "a view of a view's view"
        return base.to(device).as_strided(value.shape, value.stride(), value.storage_offset())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        tensors = {
            f.name: getattr(value, f.name)
            for f in dataclasses.fields(value)
            if isinstance(getattr(value, f.name), torch.Tensor)
        }
        return dataclasses.replace(value, **{k: to_device(t, device) for k, t in tensors.items()})
    return value


def on_device(launch: Callable[..., Any], device: torch.device) -> Callable[..., Any]:
    """``launch`` taking and returning CPU tensors, run on ``device``."""

    @functools.wraps(launch)
    def run(*args: Any, **kwargs: Any) -> Any:
        moved = [to_device(arg, device) for arg in args]
        result = launch(*moved, **{k: to_device(v, device) for k, v in kwargs.items()})
        for arg, copy in zip(args, moved, strict=True):
            if isinstance(arg, torch.Tensor):  # what the launcher wrote (store_kv's caches)
                arg.copy_(copy)
        if isinstance(result, tuple):
            return tuple(t.cpu() for t in result)
        return result if result is None else result.cpu()

    return run


# The launchers the checks call, by the module whose globals they are called through.
LAUNCHERS = {
    attention: ("store_kv_triton", "paged_attention_triton"),
    elementwise: (
        "rms_norm_triton",
        "fused_add_rms_norm_triton",
        "rotary_triton",
        "silu_and_mul_triton",
    ),
    sys.modules[__name__]: ("quantized_linear_triton",),
}


def run_launchers_on(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    for module, names in LAUNCHERS.items():
        for name in names:
            monkeypatch.setattr(module, name, on_device(getattr(module, name), device))


@pytest.fixture
def on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every launcher the checks call runs on the GPU, compiled. In a run that interprets
    the kernels (tests/conftest.py turns the interpreter on unless
    TRITON_INTERPRET=0) these tests would only repeat the interpreter tests, slowly."""
    if interpreting():
        pytest.skip("the Triton kernels are interpreted in this run: set TRITON_INTERPRET=0")
    run_launchers_on(torch.device("cuda"), monkeypatch)


def cases_of(test: Callable[..., None]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Parametrize a GPU test as the interpreter ``test`` is, so both run the same cases."""

    def parametrize(gpu_test: Callable[..., None]) -> Callable[..., None]:
        for mark in test.pytestmark:
            if mark.name == "parametrize":
                gpu_test = pytest.mark.parametrize(*mark.args, **mark.kwargs)(gpu_test)
        return gpu_test

    return parametrize


# ---- the checks (the interpreter tests' bodies aside) ----

# (num_kv_heads, group, head_dim): the interpreter tests' GQA 3 with an odd head size, and
# Qwen2.5-0.5B's 14 heads over 2 KV heads of 64, whose group of 7 puts 18 query tokens
# in a GPU prefill tile of 128 rows.
SHAPES = {"gqa3-head20": (2, 3, 20), "gqa7-head64": (2, 7, 64)}
KINDS = {"decode": attention.decode_chunks, "mixed": attention.mixed_chunks}
BLOCK_SIZE = 16


def check_attention(
    shape: tuple[int, int, int],
    dtype: torch.dtype,
    chunks: list[tuple[int, int]],
    window: int | None = None,
    tiles: AttentionTiles | None = None,
) -> None:
    """store_kv then paged attention over a noisy paged cache against the fp32 reference;
    ``tiles`` None: the ones the device picks."""
    num_kv_heads, group, head_dim = shape
    batch = make_batch(chunks, BLOCK_SIZE, num_kv_heads, group, head_dim, dtype, seed=group)
    expected = attention.reference(batch, window)
    what = f"{len(chunks)} sequences, window {window}, tiles {tiles}"
    assert_close(attention.run_triton(batch, window, tiles), expected, dtype, what)


OUT_FEATURES = 80  # 3 decode tiles of 32 outputs and 2 prefill tiles of 64, the last partial
# Rows of at least 4 steps of 256 values, so that a decode splits K on any GPU: the last
# step of the 32-value block types holds one block (1056 = 33 x 32), I8's is masked.
IN_FEATURES = {"Q4_K": 1024, "Q5_K": 1024, "Q6_K": 1024, "I8": 1000}
# (activations, rows) -> the tiles the device picks: 16 x 32 with K split for decodes,
# 64 x 64 and 32 x 64 for prefills; fp32 takes tl.dot in IEEE fp32.
QUANTIZED_CASES = {
    "bf16-decode": (torch.bfloat16, 1),
    "bf16-prefill": (torch.bfloat16, 40),
    "fp16-prefill": (torch.float16, 17),
    "fp32-decode": (torch.float32, 5),
}


def check_quantized_linear(qtype: str, dtype: torch.dtype, rows: int) -> None:
    """The kernel on the weight's own blocks, with a bias, against the fp64 product with
    the dequantized weight."""
    in_features = IN_FEATURES.get(qtype, 1056)
    weight = quantized.weight_of(qtype, OUT_FEATURES, in_features)
    x = randn(rows, in_features, dtype=dtype, seed=3)
    bias = randn(OUT_FEATURES, seed=2)
    actual = quantized_linear_triton(x, weight, bias)
    if dtype != torch.bfloat16:
        quantized.assert_matches(actual, x, weight, bias)
        return
    # assert_matches bounds fp32 and fp16 results. bf16's is the fp32 sum rounded to 8
    # bits: within an ulp (2^-7 of it; the GPU rounds to nearest, the interpreter
    # truncates), beside the fp32 sums' error (1e-6 of sum |x| |w|, as assert_matches).
    dequantized = weight.dequantize(torch.float64)
    exact = x.double() @ dequantized.T + bias.double()
    magnitude = float((x.double().abs() @ dequantized.abs().T).max())
    assert actual.dtype == dtype
    torch.testing.assert_close(actual.double(), exact, rtol=2**-7, atol=1e-6 * magnitude)


def test_the_checks_run_in_the_interpreter(monkeypatch: pytest.MonkeyPatch):
    """One small case of each through the wrapping the GPU tests use, on the CPU."""
    run_launchers_on(torch.device("cpu"), monkeypatch)
    check_attention(SHAPES["gqa3-head20"], torch.float16, attention.decode_chunks(BLOCK_SIZE))
    check_quantized_linear("Q4_0", torch.bfloat16, 1)
    attention.test_store_kv_matches_reference_and_skips_padding(torch.float16, BLOCK_SIZE)
    elementwise.test_rotary(torch.float16, False, 5, 4, 2, 12)


# ---- attention ----


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_attention_on_cuda(on_cuda, dtype, shape, kind):
    """Decodes (16-row tiles), and prefill chunks with decodes and chunks after cached
    context (128-row tiles), in the tiles the device picks."""
    check_attention(SHAPES[shape], dtype, KINDS[kind](BLOCK_SIZE))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_attention_split_context_on_cuda(on_cuda, dtype):
    """Flash-decoding's partial results and the kernel that combines them: four splits
    forced on short contexts (most of them empty, as in a CUDA graph captured for the
    longest context), and the split the device picks for a long context."""
    check_attention(
        SHAPES["gqa3-head20"],
        dtype,
        attention.decode_chunks(BLOCK_SIZE),
        tiles=attention.small_tiles(3, num_splits=4),
    )
    long_decodes = [(1500, 1), (700, 1)]
    num_kv_heads, group, _ = SHAPES["gqa7-head64"]
    gpu = device_info(torch.empty(0, device="cuda"))
    tiles = choose_tiles(gpu, 64, group, len(long_decodes), num_kv_heads, 1, 1501)
    assert tiles.num_splits > 1, tiles
    check_attention(SHAPES["gqa7-head64"], dtype, long_decodes)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
def test_attention_gemma3_head_dim_on_cuda(on_cuda, kind):
    """Gemma 3's heads of 256 values (4 query heads on one KV head), in bf16."""
    check_attention((1, 4, 256), torch.bfloat16, KINDS[kind](BLOCK_SIZE))


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
def test_attention_sliding_window_bf16_on_cuda(on_cuda, kind):
    check_attention(SHAPES["gqa3-head20"], torch.bfloat16, KINDS[kind](BLOCK_SIZE), window=7)


@pytest.mark.cuda
@cases_of(attention.test_attention_sliding_window)
def test_attention_sliding_window_on_cuda(on_cuda, window, softcap):
    attention.test_attention_sliding_window(window, softcap)


@pytest.mark.cuda
@cases_of(attention.test_attention_head_dims)
def test_attention_head_dims_on_cuda(on_cuda, head_dim):
    attention.test_attention_head_dims(head_dim)


@pytest.mark.cuda
@cases_of(attention.test_store_kv_matches_reference_and_skips_padding)
def test_store_kv_on_cuda(on_cuda, dtype, block_size):
    attention.test_store_kv_matches_reference_and_skips_padding(dtype, block_size)


@pytest.mark.cuda
def test_strided_inputs_and_mixed_dtypes_on_cuda(on_cuda):
    """A query wider than its heads (a view into the qkv output); fp16 rows normed by an
    fp32 weight."""
    attention.test_attention_strided_query()
    elementwise.test_rms_norm_fp32_weight_promotes_like_the_reference()


# ---- quantized KV caches (kernels/kv_quant.py) ----


@pytest.mark.cuda
@cases_of(attention.test_int8_cache_matches_dequantized_reference)
def test_int8_cache_on_cuda(on_cuda, group, head_dim, window, num_splits, softcap):
    attention.test_int8_cache_matches_dequantized_reference(
        group, head_dim, window, num_splits, softcap
    )


@pytest.mark.cuda
@cases_of(attention.test_int8_store_kv_matches_reference)
def test_int8_store_kv_on_cuda(on_cuda, head_dim):
    attention.test_int8_store_kv_matches_reference(head_dim)


@pytest.mark.cuda
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head_dim", [64, 256])
def test_fp8_cache_on_cuda(on_cuda, head_dim, kind):
    """e4m3 values, which the interpreter cannot run: the compiled store and attention
    against the fp32 reference on the same rows rounded to e4m3 (by torch's store)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs compute capability 8.9")
    batch = make_batch(KINDS[kind](BLOCK_SIZE), BLOCK_SIZE, 2, 2, head_dim, torch.bfloat16, seed=5)
    batch = quantized_cache(batch, torch.float8_e4m3fn)
    out = attention.run_triton(batch, None)
    expected = attention.quantized_reference(batch, None, None)
    assert_close(out, expected, torch.bfloat16, f"fp8 {kind}")


# ---- RMSNorm, RoPE, SiLU-and-mul ----


@pytest.mark.cuda
@cases_of(elementwise.test_rms_norm)
def test_rms_norm_on_cuda(on_cuda, dtype, num_rows, hidden):
    elementwise.test_rms_norm(dtype, num_rows, hidden)


@pytest.mark.cuda
@cases_of(elementwise.test_rotary)
def test_rotary_on_cuda(on_cuda, dtype, is_neox, num_tokens, num_heads, num_kv_heads, head_dim):
    elementwise.test_rotary(dtype, is_neox, num_tokens, num_heads, num_kv_heads, head_dim)


@pytest.mark.cuda
@cases_of(elementwise.test_silu_and_mul)
def test_silu_and_mul_on_cuda(on_cuda, dtype, num_rows, d):
    elementwise.test_silu_and_mul(dtype, num_rows, d)


# ---- linear layers on quantized weights ----


@pytest.mark.cuda
@pytest.mark.parametrize("case", QUANTIZED_CASES)
@pytest.mark.parametrize("qtype", quantized.TYPES)
def test_quantized_linear_on_cuda(on_cuda, qtype, case):
    check_quantized_linear(qtype, *QUANTIZED_CASES[case])


# ---- LoRA's grouped update and the experts' grouped GEMM ----


def cuda_tensors(packed: tuple) -> tuple:
    """A NamedTuple of tensors (packed weights) with each on the GPU."""
    return type(packed)(*(t.cuda() for t in packed))


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_lora_on_cuda(on_cuda, dtype):
    """test_lora_kernels' step (rows of three adapters and none, up to rank 64) on the GPU."""
    from hetero_infer.kernels.lora_triton import add_lora_triton, pack_lora_triton

    rows = len(lora.ROW_ADAPTERS)
    x = lora.random(rows, lora.IN, seed=200).to(dtype)
    base = lora.random(rows, lora.COLUMNS, seed=201).to(dtype)
    groups = [(r.cuda(), cuda_tensors(p)) for r, p in lora.groups_of(pack_lora_triton, dtype)]
    out = add_lora_triton(base.cuda(), x.cuda(), groups).cpu()
    assert_close(out, lora.expected_out(x, base).to(dtype), dtype, "add_lora_triton")


@pytest.mark.cuda
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float16, 2e-2)])
def test_moe_on_cuda(on_cuda, dtype, tolerance):
    """test_moe_triton's block (6 experts, top 2, 9 tokens) on the GPU: fp32 must stay
    IEEE fp32 in tl.dot (no TF32) to hold 1e-5."""
    from hetero_infer.kernels.moe import MoeLayerSpec
    from hetero_infer.kernels.moe_triton import pack_moe_triton

    h, w, e = moe.HIDDEN, moe.WIDTH, moe.EXPERTS
    spec = MoeLayerSpec(
        router=moe.randn(e, h, seed=8, dtype=dtype),
        gate_up=moe.randn(e, 2 * w, h, seed=9, dtype=dtype) * 0.2,
        down=moe.randn(e, h, w, seed=10, dtype=dtype) * 0.2,
        activation="silu",
        top_k=moe.TOP_K,
        renormalize=True,
        shared=None,
    )
    on_gpu = dataclasses.replace(
        spec, router=spec.router.cuda(), gate_up=spec.gate_up.cuda(), down=spec.down.cuda()
    )
    x = moe.randn(9, h, seed=11, dtype=dtype)
    out = pack_moe_triton(on_gpu)(x.cuda()).cpu()
    expected = moe.reference(x, spec)
    assert (out.float() - expected).abs().max().item() <= tolerance * expected.abs().max().item()
