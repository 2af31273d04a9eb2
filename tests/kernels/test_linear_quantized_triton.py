"""The Triton linear kernel on quantized weights (interpreter) against the fp64 product
with gguf-py's dequantized weight, and a tiny GGUF model run through it.

The kernel multiplies each block's integers exactly and scales the fp32 product, so
it differs from ``x @ dequantize(W)^T`` in fp64 by fp32 rounding only, plus the
rounding of the result to x's dtype.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import gguf  # noqa: E402
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402
from hetero_infer.engine.loader.gguf import GGUF_LAYER_PARTS  # noqa: E402
from hetero_infer.kernels import linear_quantized_triton  # noqa: E402
from hetero_infer.kernels.linear_quantized_triton import (  # noqa: E402
    QuantizedTiles,
    TritonQuantizedLinear,
    choose_tiles,
    quantized_linear_triton,
    triton_quantized_takes,
)
from hetero_infer.kernels.quantized import QuantizedWeight  # noqa: E402
from hetero_infer.kernels.triton_utils import DeviceInfo  # noqa: E402

from tests.kernels.test_quantized_linear import quantized, randn, raw_weight  # noqa: E402

GGUF_QUANTIZED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # gguf-py quantizes these
RAW = ("Q4_K", "Q5_K", "Q6_K")  # gguf-py cannot quantize the K-quants: random bytes
TYPES = (*GGUF_QUANTIZED, *RAW, "I8")
DTYPES = [torch.float32, torch.float16]
DTYPE_IDS = ["fp32", "fp16"]


@functools.cache
def int8_weight(out_features: int, in_features: int, seed: int = 4) -> QuantizedWeight:
    """Random int8 values, the full range, and positive fp32 scales per row."""
    generator = torch.Generator().manual_seed(seed)
    shape = (out_features, in_features)
    values = torch.randint(-128, 128, shape, dtype=torch.int8, generator=generator)
    scales = torch.rand(out_features, generator=generator) * 0.02 + 1e-3
    return QuantizedWeight("I8", values, shape, scales)


@functools.cache
def weight_of(qtype: str, out_features: int, in_features: int) -> QuantizedWeight:
    if qtype == "I8":
        return int8_weight(out_features, in_features)
    if qtype in RAW:
        return raw_weight(qtype, out_features, in_features)
    return quantized(qtype, out_features, in_features)


def assert_matches(
    actual: torch.Tensor, x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None
) -> None:
    """|actual - exact| <= rounding to x's dtype + fp32 rounding of the sums (1e-6 of
    sum |x| |w|, K / 32 scaled block products added in fp32)."""
    dequantized = weight.dequantize(torch.float64)
    exact = x.double() @ dequantized.T
    magnitude = x.double().abs() @ dequantized.abs().T
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    assert actual.dtype == x.dtype and actual.shape == exact.shape, (actual.dtype, actual.shape)
    rounding = 0.0 if x.dtype == torch.float32 else 2**-11  # half an fp16 ulp
    error = (actual.double() - exact).abs()
    bound = rounding * exact.abs() + 1e-6 * magnitude
    assert (error <= bound).all(), f"max error {error.max():.3g}, at {(error - bound).argmax()}"


# (rows, dtype, (out_features, in_features), bias) per type: the interpreter's tiles of
# 16 rows (1, 5) and of 64 (33), one step of K (256) and two (512), outputs masked in a
# tile of 64 (48) or 128 (80). Every pair of these choices is in some case, so each row
# count meets both dtypes, both shapes and a bias and none; each dtype and each shape
# meets both, too. (The kernel's branches are by type, dtype and bias; rows and shape
# only move masks and the loop's bounds.)
CASES = [
    (1, torch.float32, (48, 256), False),
    (1, torch.float16, (80, 512), True),
    (5, torch.float32, (80, 512), True),
    (5, torch.float16, (48, 256), False),
    (33, torch.float32, (48, 256), True),
    (33, torch.float16, (80, 512), False),
]
CASE_IDS = [
    f"{rows}-{DTYPE_IDS[DTYPES.index(dtype)]}-{n}x{k}{'-bias' if bias else ''}"
    for rows, dtype, (n, k), bias in CASES
]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize(("rows", "dtype", "shape", "with_bias"), CASES, ids=CASE_IDS)
def test_matches_the_dequantized_product(qtype, rows, dtype, shape, with_bias):
    out_features, in_features = shape
    weight = weight_of(qtype, out_features, in_features)
    x = randn(rows, in_features, dtype=dtype)
    bias = randn(out_features, seed=2) if with_bias else None
    assert_matches(TritonQuantizedLinear(weight, bias)(x), x, weight, bias)


# Tiles as a GPU takes them (decode; larger M), and the split-K path with a bias: several
# programs along N and M, partial tiles, the last step of a 32-block row ending early
# (K = 352: one step of 8 blocks and one of 3; I8 with K = 200 masks within a step).
# (tiles, rows of x, out_features): the interpreter pays per program, so each shape is
# the smallest with more than one program along N and a partial last tile.
GPU_TILES = {
    # a decode's M tile (5 rows of 16); N tiles of 32 and 8; K in 3 splits, the bias
    # added to their sum
    "decode-split": (QuantizedTiles(16, 32, 3, 4, 2), 5, 40),
    # M tiles of 16 rows and 1; N tiles of 16, 16 and 8
    "rows": (QuantizedTiles(16, 16, 1, 4, 2), 17, 40),
    # one M tile of 33 rows of 64; N tiles of 64 and 16
    "prefill": (QuantizedTiles(64, 64, 1, 4, 2), 33, 80),
}


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize(("tiles", "rows", "out_features"), GPU_TILES.values(), ids=GPU_TILES)
def test_gpu_tiles_and_split_k(qtype, tiles, rows, out_features):
    in_features = {"Q4_K": 768, "Q5_K": 768, "Q6_K": 768, "I8": 200}.get(qtype, 352)
    weight = weight_of(qtype, out_features, in_features)
    x = randn(rows, in_features, dtype=torch.float16, seed=3)
    bias = randn(out_features, seed=2)
    actual = quantized_linear_triton(x, weight, bias, tiles=tiles)
    assert_matches(actual, x, weight, bias)


@pytest.mark.parametrize("qtype", GGUF_QUANTIZED)
def test_raw_blocks_of_any_values(qtype):
    # Q8_0's -128 and every nibble, which a quantizer may not make.
    weight = raw_weight(qtype, 40, 256)
    x = randn(3, 256)
    assert_matches(TritonQuantizedLinear(weight)(x), x, weight, None)


def test_leading_dims_strides_and_empty_batches():
    weight = weight_of("Q4_1", 48, 256)
    linear = TritonQuantizedLinear(weight, randn(48, seed=2, dtype=torch.float16))
    x = randn(2, 3, 256)
    actual = linear(x)
    assert actual.shape == (2, 3, 48)
    assert_matches(actual.reshape(6, 48), x.reshape(6, 256), weight, linear.bias)
    strided = randn(4, 512)[:, ::2]  # not contiguous
    assert_matches(linear(strided), strided.contiguous(), weight, linear.bias)
    assert linear(randn(0, 256)).shape == (0, 48)


def test_decode_splits_k_where_sms_would_idle():
    gpu = DeviceInfo(False, 132, (9, 0))
    # 18 tiles of 32 outputs; too few steps of K to split (two at least per split)
    narrow = choose_tiles(gpu, 1, 576, num_steps=3)
    assert (narrow.block_m, narrow.block_n, narrow.num_splits) == (16, 32, 1)
    wide_k = choose_tiles(gpu, 4, 576, num_steps=32)
    assert wide_k.num_splits > 1 and 18 * wide_k.num_splits <= 2 * 132 + 18
    assert choose_tiles(gpu, 1, 16384, num_steps=16).num_splits == 1
    assert choose_tiles(gpu, 512, 4096, num_steps=16) == QuantizedTiles(64, 64, 1, 4, 2)


def test_takes(monkeypatch):
    assert all(triton_quantized_takes(weight_of(qtype, 48, 256)) for qtype in TYPES)
    q8 = weight_of("Q8_0", 48, 256)
    with monkeypatch.context() as patch:  # CPU tensors outside the interpreter: no
        patch.setattr(linear_quantized_triton, "interpreting", lambda: False)
        assert not triton_quantized_takes(q8)
    int8 = weight_of("I8", 48, 256)
    scales = int8.scales.double()
    assert not triton_quantized_takes(QuantizedWeight("I8", int8.data, int8.shape, scales))
    columns = torch.zeros(256, 48, dtype=torch.int8).T  # rows not contiguous
    assert not triton_quantized_takes(QuantizedWeight("I8", columns, (48, 256), int8.scales))


# ---- a tiny GGUF model ----

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2
# GGUF tensor part -> its type in the file, per layer: every type the kernel takes from
# a file of 32-wide rows, one part left in F16 (no quantized kernel: dequantized at load).
PART_TYPES = {
    "attn_q": ("Q4_0", "Q5_0"),
    "attn_k": ("Q4_0", "Q5_0"),
    "attn_v": ("Q4_0", "Q5_0"),
    "attn_output": ("F16", "F16"),
    "ffn_gate": ("Q8_0", "Q5_1"),
    "ffn_up": ("Q8_0", "Q5_1"),
    "ffn_down": ("Q4_1", "Q5_0"),
}
HF_PARTS = GGUF_LAYER_PARTS  # llama.cpp's part names -> HF's


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter's q/k row order (RoPE pairs adjacent), which the loader
    undoes."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def add_tensor(writer, name: str, values: torch.Tensor, qtype: str) -> None:
    array = values.float().numpy()
    if qtype in ("F32", "F16"):
        writer.add_tensor(name, array.astype(np.float16 if qtype == "F16" else np.float32))
        return
    kind = gguf.GGMLQuantizationType[qtype]
    writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(folder with the config and tokenizer, the .gguf file): a random Llama with a tied
    Q8_0 embedding, written as llama.cpp lays a file out."""
    import transformers

    from tests.helpers import make_byte_fallback_tokenizer
    from tests.tiny_models import COMMON

    folder = tmp_path_factory.mktemp("tiny-gguf")
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        **{**COMMON, "tie_word_embeddings": True, "max_position_embeddings": 128},
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    config.save_pretrained(folder)
    make_byte_fallback_tokenizer().save_pretrained(folder)
    weights = {name: t.detach() for name, t in model.state_dict().items()}

    path = folder / "tiny.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    add_tensor(writer, "token_embd.weight", weights["model.embed_tokens.weight"], "Q8_0")
    add_tensor(writer, "output_norm.weight", weights["model.norm.weight"], "F32")
    for layer in range(LAYERS):
        for part, hf_part in HF_PARTS.items():
            values = weights[f"model.layers.{layer}.{hf_part}.weight"]
            if part in ("attn_q", "attn_k"):
                heads = HEADS if part == "attn_q" else KV_HEADS
                values = torch.from_numpy(llama_cpp_permute(values.numpy(), heads))
            qtype = PART_TYPES[part][layer] if part in PART_TYPES else "F32"  # norms: F32
            add_tensor(writer, f"blk.{layer}.{part}.weight", values, qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return folder, path


def run_gguf(path, quantization: str, prompts: list[list[int]]) -> list[list[int]]:
    engine = LLMEngine(
        EngineConfig(
            model=str(path),
            dtype="float32",
            attention_backend="triton",
            quantization=quantization,
            block_size=16,
            max_num_blocks=8,
            max_model_len=64,
        )
    )
    # A prefill step and a decode step; more tokens would only repeat the decode
    params = SamplingParams(max_tokens=2, temperature=0.0)
    return [out.token_ids for out in engine.generate(prompts, params, use_tqdm=False)]


def test_tiny_gguf_model_quantized_matches_dequantized(tiny_gguf, monkeypatch):
    """The same file's greedy tokens with its blocks kept for the Triton kernel and with
    every weight dequantized at load (exact in fp32 but for the order of the sums)."""
    from hetero_infer.engine.loader import metadata

    folder, path = tiny_gguf
    # The config and tokenizer come from the folder the file was written from: turning a
    # GGUF's metadata into them is transformers' work, not what is tested here.
    monkeypatch.setattr(metadata, "gguf_metadata_folder", lambda source: folder)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 384) for _ in range(n)] for n in (7, 3)]
    expected = run_gguf(path, "none", prompts)

    calls: list[str] = []
    launch = linear_quantized_triton.quantized_linear_triton

    def counted(x, weight, bias=None, **kwargs):
        calls.append(weight.qtype)
        return launch(x, weight, bias, **kwargs)

    monkeypatch.setattr(linear_quantized_triton, "quantized_linear_triton", counted)
    actual = run_gguf(path, "gguf", prompts)
    # q/k/v, gate/up, down and the tied lm_head through the kernel; o_proj's F16 not
    assert set(calls) == {"Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1"}, set(calls)
    assert actual == expected
