"""Every Triton kernel compiles for NVIDIA GPUs (sm80, sm90) down to a cubin, here,
without a GPU: triton's wheel ships ptxas. This is what the interpreter cannot show:
that the kernels use only what the real compiler accepts (dot shapes, constexpr
branches, early returns, dtypes). The variants are the ones choose_tiles picks.

Each variant compiles for sm90 first, and for sm80 only where sm90's PTX holds
tensor-core instructions: their lowering is what differs between the two (wgmma against
mma), while a kernel without them (no tl.dot, or only fp32 "ieee" dots, which become
FMAs) lowers the same way on both, and compiling it again, at up to 8 s a variant,
showed nothing more.

The kernels must be real JIT functions, not the interpreter's, so the compiling runs in
a fresh Python without TRITON_INTERPRET: ``python -m tests.kernels.test_triton_compile``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

FLOATS = {"scale", "eps", "softcap"}
CAPABILITIES = (90, 80)  # sm90 first: its PTX says whether sm80 adds anything


def nvidia_backend() -> bool:
    try:
        return importlib.util.find_spec("triton.backends.nvidia.compiler") is not None
    except ImportError:
        return False


def compile_for(kernel, pointers: dict[str, str], constants: dict, capability: int, **options):
    """Compile ``kernel`` for sm_<capability>; pointer args typed by ``pointers``, the
    constexprs from ``constants``, every other argument an i32 (or an fp32 for FLOATS)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {}
    for name in kernel.arg_names:
        if name in pointers:
            signature[name] = pointers[name]
        elif name in constants:
            signature[name] = "constexpr"
        else:
            signature[name] = "fp32" if name in FLOATS else "i32"
    source = ASTSource(kernel, signature, constants)
    return triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)


def attention_pointers(dtype: str, cache: str | None = None) -> dict[str, str]:
    """``cache``: the KV cache's element type where it is not the query's (int8 rows)."""
    return {
        **{n: f"*{dtype}" for n in ("out_ptr", "query_ptr")},
        **{n: f"*{cache or dtype}" for n in ("k_cache_ptr", "v_cache_ptr")},
        **{n: "*i32" for n in ("block_tables_ptr", "context_lens_ptr", "query_start_loc_ptr")},
        "part_out_ptr": "*fp32",
        "part_lse_ptr": "*fp32",
    }


def attention_constants(**overrides) -> dict:
    constants = dict(
        BLOCK_SIZE=16,
        GROUP=4,
        BLOCK_M=16,
        BLOCK_Q=4,
        BLOCK_N=64,
        HEAD_PAD=128,
        NUM_SPLITS=1,
        USE_WINDOW=False,
        USE_SOFTCAP=False,
        DOT_FP32=False,
        QUANT=0,
    )
    return {**constants, **overrides}


def quantized_linear_pointers(activations: str, out: str, weight: str = "u8") -> dict[str, str]:
    return {
        "out_ptr": f"*{out}",
        "x_ptr": f"*{activations}",
        "w_ptr": f"*{weight}",
        "scales_ptr": "*fp32",
        "bias_ptr": "*fp32",
    }


def quantized_linear_constants(qtype: str, block_m: int, block_n: int, **overrides) -> dict:
    from hetero_infer.kernels.linear_quantized_triton import BLOCK_BYTES

    constants = dict(
        QTYPE=qtype,
        BLOCK_BYTES=BLOCK_BYTES[qtype],
        HAS_BIAS=False,
        DOT_FP32=False,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
    )
    return {**constants, **overrides}


QUANTIZED_LINEAR = "hetero_infer.kernels.linear_quantized_triton:_quantized_linear_kernel"
PLANES_GEMV = "hetero_infer.kernels.linear_planes_triton:_planes_gemv_kernel"
PLANES_DOT = "hetero_infer.kernels.linear_planes_triton:_planes_dot_kernel"
PLANES_WORDS = "hetero_infer.kernels.planes_gemv_triton:_planes_gemv_words_kernel"
# Each type's planes' element types (kernels/quantized_planes.py), by kernel argument.
PLANE_POINTERS = {
    "Q8_0": dict(v_ptr="i8", s_ptr="fp16"),
    "Q4_0": dict(v_ptr="u8", s_ptr="fp16"),
    "Q4_1": dict(v_ptr="u8", s_ptr="fp16", m_ptr="fp16"),
    "Q5_0": dict(v_ptr="u8", h_ptr="i32", s_ptr="fp16"),
    "Q5_1": dict(v_ptr="u8", h_ptr="i32", s_ptr="fp16", m_ptr="fp16"),
    "Q4_K": dict(v_ptr="u8", s_ptr="u8", m_ptr="u8", d_ptr="fp16", dm_ptr="fp16"),
    "Q5_K": dict(v_ptr="u8", h_ptr="u8", s_ptr="u8", m_ptr="u8", d_ptr="fp16", dm_ptr="fp16"),
    "Q6_K": dict(v_ptr="u8", h_ptr="u8", s_ptr="i8", d_ptr="fp16"),
}


def planes_pointers(qtype: str, activations: str, out: str) -> dict[str, str]:
    """A type's planes, a placeholder (the values plane) where it has none."""
    planes = PLANE_POINTERS[qtype]
    names = ("v_ptr", "h_ptr", "s_ptr", "m_ptr", "d_ptr", "dm_ptr")
    pointers = {name: f"*{planes.get(name, planes['v_ptr'])}" for name in names}
    return {**pointers, "out_ptr": f"*{out}", "x_ptr": f"*{activations}", "bias_ptr": "*fp32"}


def word_pointers(qtype: str, activations: str, out: str) -> dict[str, str]:
    """The word GEMV's: the values and highs planes as int32 words, the K-quants' byte
    scales (Q6_K's signed)."""
    scales = {"Q4_K": "u8", "Q5_K": "u8", "Q6_K": "i8"}.get(qtype, "fp16")
    planes = dict(v_ptr="i32", h_ptr="i32", s_ptr=scales, m_ptr=scales, d_ptr="fp16", dm_ptr="fp16")
    pointers = {name: f"*{kind}" for name, kind in planes.items()}
    return {**pointers, "out_ptr": f"*{out}", "x_ptr": f"*{activations}", "bias_ptr": "*fp32"}


def planes_constants(qtype: str, block_m: int, block_n: int, **overrides) -> dict:
    from hetero_infer.kernels.linear_planes_triton import HAS_OFFSET

    constants = dict(
        QTYPE=qtype,
        HAS_OFFSET=qtype in HAS_OFFSET,
        HAS_BIAS=False,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
    )
    return {**constants, **overrides}


# (name, kernel, pointers, constants, launch options)
VARIANTS = [
    (
        "decode-bf16-splits",
        "hetero_infer.kernels.paged_attention_triton:_paged_attention_kernel",
        attention_pointers("bf16"),
        attention_constants(NUM_SPLITS=4),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "prefill-fp16-window",
        "hetero_infer.kernels.paged_attention_triton:_paged_attention_kernel",
        attention_pointers("fp16"),
        attention_constants(GROUP=3, BLOCK_M=128, BLOCK_Q=42, USE_WINDOW=True),
        dict(num_warps=8, num_stages=3),
    ),
    (  # Gemma 2: soft-capped scores, sliding layers, head_dim 256
        "prefill-bf16-softcap-window",
        "hetero_infer.kernels.paged_attention_triton:_paged_attention_kernel",
        attention_pointers("bf16"),
        attention_constants(
            GROUP=2,
            BLOCK_M=64,
            BLOCK_Q=32,
            BLOCK_N=32,
            HEAD_PAD=256,
            USE_WINDOW=True,
            USE_SOFTCAP=True,
        ),
        dict(num_warps=4, num_stages=3),
    ),
    (  # --kv-cache-dtype int8: rows of int8 values and their groups' fp16 scales
        "decode-bf16-int8-kv",
        "hetero_infer.kernels.paged_attention_triton:_paged_attention_kernel",
        attention_pointers("bf16", cache="i8"),
        attention_constants(NUM_SPLITS=4, QUANT=1),
        dict(num_warps=4, num_stages=2),
    ),
    (  # --kv-cache-dtype fp8: e4m3 values, no scale (the interpreter has no fp8)
        "decode-bf16-fp8-kv",
        "hetero_infer.kernels.paged_attention_triton:_paged_attention_kernel",
        attention_pointers("bf16", cache="fp8e4nv"),
        attention_constants(NUM_SPLITS=4, QUANT=2),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "prefill-fp32-head24",
        "hetero_infer.kernels.paged_attention_triton:_paged_attention_kernel",
        attention_pointers("fp32"),
        attention_constants(GROUP=1, BLOCK_M=64, BLOCK_Q=64, HEAD_PAD=32, DOT_FP32=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "combine",
        "hetero_infer.kernels.paged_attention_triton:_combine_splits_kernel",
        {"out_ptr": "*bf16", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"},
        dict(BLOCK_R=4, NUM_SPLITS=4, HEAD_PAD=128),
        dict(num_warps=4),
    ),
    (
        "store_kv",
        "hetero_infer.kernels.store_kv_triton:_store_kv_kernel",
        {
            **{n: "*bf16" for n in ("key_ptr", "value_ptr", "k_cache_ptr", "v_cache_ptr")},
            "slot_mapping_ptr": "*i64",
        },
        dict(BLOCK_SIZE=16, BLOCK_T=4, HEADS_PAD=8, HEAD_PAD=128, QUANT=0, SCALE_GROUP=32),
        dict(num_warps=4),
    ),
    (
        "store_kv-int8",
        "hetero_infer.kernels.store_kv_triton:_store_kv_kernel",
        {
            **{n: "*bf16" for n in ("key_ptr", "value_ptr")},
            **{n: "*i8" for n in ("k_cache_ptr", "v_cache_ptr")},
            "slot_mapping_ptr": "*i64",
        },
        dict(BLOCK_SIZE=16, BLOCK_T=4, HEADS_PAD=8, HEAD_PAD=128, QUANT=1, SCALE_GROUP=32),
        dict(num_warps=4),
    ),
    (
        "store_kv-fp8",
        "hetero_infer.kernels.store_kv_triton:_store_kv_kernel",
        {
            **{n: "*bf16" for n in ("key_ptr", "value_ptr")},
            **{n: "*fp8e4nv" for n in ("k_cache_ptr", "v_cache_ptr")},
            "slot_mapping_ptr": "*i64",
        },
        dict(BLOCK_SIZE=16, BLOCK_T=4, HEADS_PAD=8, HEAD_PAD=128, QUANT=2, SCALE_GROUP=32),
        dict(num_warps=4),
    ),
    (
        "fused_add_rms_norm",
        "hetero_infer.kernels.rms_norm_triton:_rms_norm_kernel",
        {
            **{n: "*bf16" for n in ("out_ptr", "residual_out_ptr", "x_ptr", "residual_ptr")},
            "weight_ptr": "*bf16",
        },
        dict(BLOCK_ROWS=1, BLOCK_H=4096, HAS_RESIDUAL=True),
        dict(num_warps=8),
    ),
    (
        "rotary-gptj",
        "hetero_infer.kernels.rotary_triton:_rotary_kernel",
        {
            **{n: "*bf16" for n in ("q_out_ptr", "k_out_ptr", "q_ptr", "k_ptr")},
            "positions_ptr": "*i64",
            "cos_ptr": "*fp32",
            "sin_ptr": "*fp32",
        },
        dict(BLOCK_T=1, HEADS_PAD=32, HALF_PAD=64, IS_NEOX=False),
        dict(num_warps=4),
    ),
    (  # decode, split-K: fp32 partial sums
        "quantized-q4_k-decode-split",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("bf16", "fp32"),
        quantized_linear_constants("Q4_K", 16, 32),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q5_k-decode-fp16",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("fp16", "fp16"),
        quantized_linear_constants("Q5_K", 16, 32),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q6_k-prefill-fp16-bias",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("fp16", "fp16"),
        quantized_linear_constants("Q6_K", 64, 64, HAS_BIAS=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q8_0-decode-bias",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("bf16", "bf16"),
        quantized_linear_constants("Q8_0", 16, 32, HAS_BIAS=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q4_0-rows",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("bf16", "bf16"),
        quantized_linear_constants("Q4_0", 32, 64),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q5_0-decode-split",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("bf16", "fp32"),
        quantized_linear_constants("Q5_0", 16, 32),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q5_1-prefill-bias",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("bf16", "bf16"),
        quantized_linear_constants("Q5_1", 64, 64, HAS_BIAS=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-q4_1-prefill-fp32",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("fp32", "fp32"),
        quantized_linear_constants("Q4_1", 64, 64, DOT_FP32=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "quantized-int8-decode",
        QUANTIZED_LINEAR,
        quantized_linear_pointers("bf16", "bf16", weight="i8"),
        quantized_linear_constants("I8", 16, 32),
        dict(num_warps=4, num_stages=2),
    ),
    (  # GGUF planes, decode: 1 row, 2 weight rows a program (choose_planes_tiles)
        "planes-gemv-q4_0-bf16",
        PLANES_GEMV,
        planes_pointers("Q4_0", "bf16", "bf16"),
        planes_constants("Q4_0", 1, 2, HAS_BIAS=True, UNROLL=8),
        dict(num_warps=1, num_stages=3),
    ),
    (  # 4 rows, a split's fp32 partial sums
        "planes-gemv-q4_k-fp16-split",
        PLANES_GEMV,
        planes_pointers("Q4_K", "fp16", "fp32"),
        planes_constants("Q4_K", 4, 8, UNROLL=4),  # 4 steps a loop turn
        dict(num_warps=2, num_stages=3),
    ),
    (
        "planes-gemv-q6_k-bf16",
        PLANES_GEMV,
        planes_pointers("Q6_K", "bf16", "bf16"),
        planes_constants("Q6_K", 2, 8, UNROLL=2),
        dict(num_warps=2, num_stages=3),
    ),
    (  # the word GEMV at 1 row: 8 weight rows a program, 4 warps (choose_planes_tiles)
        "planes-words-q4_0-bf16",
        PLANES_WORDS,
        word_pointers("Q4_0", "bf16", "bf16"),
        dict(QTYPE="Q4_0", HAS_BIAS=True, BLOCK_M=1, ROWS=8, CHUNKS=128),
        dict(num_warps=4, num_stages=1),
    ),
    (  # 4 rows, a split's fp32 partial sums, 2 chunks a lane a turn
        "planes-words-q5_k-fp16-split",
        PLANES_WORDS,
        word_pointers("Q5_K", "fp16", "fp32"),
        dict(QTYPE="Q5_K", HAS_BIAS=False, BLOCK_M=4, ROWS=8, CHUNKS=128),
        dict(num_warps=2, num_stages=1),
    ),
    (
        "planes-words-q6_k-bf16",
        PLANES_WORDS,
        word_pointers("Q6_K", "bf16", "bf16"),
        dict(QTYPE="Q6_K", HAS_BIAS=False, BLOCK_M=1, ROWS=8, CHUNKS=128),
        dict(num_warps=4, num_stages=1),
    ),
    (
        "planes-words-q5_1-bf16-bias",
        PLANES_WORDS,
        word_pointers("Q5_1", "bf16", "bf16"),
        dict(QTYPE="Q5_1", HAS_BIAS=True, BLOCK_M=2, ROWS=8, CHUNKS=128),
        dict(num_warps=4, num_stages=1),
    ),
    (
        "planes-words-q8_0-bf16",
        PLANES_WORDS,
        word_pointers("Q8_0", "bf16", "bf16"),
        dict(QTYPE="Q8_0", HAS_BIAS=False, BLOCK_M=2, ROWS=4, CHUNKS=64),
        dict(num_warps=2, num_stages=1),
    ),
    (  # split-K at up to 16 rows
        "planes-split-k-q8_0-bf16",
        PLANES_DOT,
        planes_pointers("Q8_0", "bf16", "fp32"),
        planes_constants("Q8_0", 16, 64, DOT_FP32=False),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "planes-tiles-q5_1-bf16-bias",
        PLANES_DOT,
        planes_pointers("Q5_1", "bf16", "bf16"),
        planes_constants("Q5_1", 64, 64, DOT_FP32=False, HAS_BIAS=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "planes-tiles-q4_k-fp32",
        PLANES_DOT,
        planes_pointers("Q4_K", "fp32", "fp32"),
        planes_constants("Q4_K", 64, 64, DOT_FP32=True),
        dict(num_warps=4, num_stages=2),
    ),
    (
        "sample",
        "hetero_infer.kernels.sampling_triton:_sample_kernel",
        {
            "tokens_ptr": "*i64",
            "logprobs_ptr": "*fp32",
            "x_ptr": "*fp32",
            **{n: "*fp32" for n in ("temperature_ptr", "top_p_ptr", "min_p_ptr")},
            "top_k_ptr": "*i64",
            "uniforms_ptr": "*fp64",
            "wants_logprob_ptr": "*i8",
        },
        dict(BLOCK=1024),
        dict(num_warps=4),
    ),
    (  # LoRA's shrink: an adapter's rows times its A (rank padded to 16)
        "lora-shrink-bf16",
        "hetero_infer.kernels.lora_triton:_lora_shrink_kernel",
        {"t_ptr": "*fp32", "x_ptr": "*bf16", "a_ptr": "*bf16", "rows_ptr": "*i32"},
        dict(RANK=16, BLOCK_K=64),
        dict(num_warps=4),
    ),
    (  # LoRA's expand at rank 64 into fp16 rows
        "lora-expand-fp16-rank64",
        "hetero_infer.kernels.lora_triton:_lora_expand_kernel",
        {"out_ptr": "*fp16", "t_ptr": "*fp32", "b_ptr": "*fp16", "rows_ptr": "*i32"},
        dict(RANK=64, BLOCK_N=64),
        dict(num_warps=4),
    ),
    (  # mixture-of-experts: gate_up, rows gathered by token
        "moe-grouped-gemm-gate-up-bf16",
        "hetero_infer.kernels.moe_triton:_grouped_gemm_kernel",
        {
            "out_ptr": "*bf16",
            "x_ptr": "*bf16",
            "w_ptr": "*bf16",
            "rows_ptr": "*i32",
            "block_experts_ptr": "*i32",
            "weights_ptr": "*fp32",
        },  # fmt: skip
        dict(
            TOP_K=8,
            GATHER_TOKENS=True,
            MUL_WEIGHT=False,
            DOT_FP32=False,
            BLOCK_M=16,
            BLOCK_N=64,
            BLOCK_K=64,
        ),  # fmt: skip
        dict(num_warps=4, num_stages=2),
    ),
    (  # mixture-of-experts: down, scaled by the routing weights
        "moe-grouped-gemm-down-fp16",
        "hetero_infer.kernels.moe_triton:_grouped_gemm_kernel",
        {
            "out_ptr": "*fp16",
            "x_ptr": "*fp16",
            "w_ptr": "*fp16",
            "rows_ptr": "*i32",
            "block_experts_ptr": "*i32",
            "weights_ptr": "*fp32",
        },  # fmt: skip
        dict(
            TOP_K=2,
            GATHER_TOKENS=False,
            MUL_WEIGHT=True,
            DOT_FP32=False,
            BLOCK_M=16,
            BLOCK_N=64,
            BLOCK_K=64,
        ),  # fmt: skip
        dict(num_warps=4, num_stages=2),
    ),
    (
        "moe-grouped-gemm-fp32",
        "hetero_infer.kernels.moe_triton:_grouped_gemm_kernel",
        {
            "out_ptr": "*fp32",
            "x_ptr": "*fp32",
            "w_ptr": "*fp32",
            "rows_ptr": "*i32",
            "block_experts_ptr": "*i32",
            "weights_ptr": "*fp32",
        },  # fmt: skip
        dict(
            TOP_K=4,
            GATHER_TOKENS=True,
            MUL_WEIGHT=True,
            DOT_FP32=True,
            BLOCK_M=16,
            BLOCK_N=64,
            BLOCK_K=64,
        ),  # fmt: skip
        dict(num_warps=4, num_stages=2),
    ),
    (
        "silu_and_mul",
        "hetero_infer.kernels.activation_triton:_silu_and_mul_kernel",
        {"out_ptr": "*bf16", "x_ptr": "*bf16"},
        dict(BLOCK_ROWS=1, BLOCK_D=4096),
        dict(num_warps=4),
    ),
]


def main() -> int:
    """Compile every variant for every capability; print each; return the failures."""
    failures = 0
    for name, kernel_path, pointers, constants, options in VARIANTS:
        module, attr = kernel_path.split(":")
        kernel = getattr(importlib.import_module(module), attr)
        tensor_cores = True
        for capability in CAPABILITIES:
            if "fp8" in name and capability < 89:
                continue  # Triton has no e4m3 before sm89: refused at start there
            if not tensor_cores:
                print(f"same {name} sm{capability}: no tensor-core instructions to lower")
                continue
            started = time.monotonic()
            try:
                compiled = compile_for(kernel, pointers, constants, capability, **options)
                assert compiled.asm.get("cubin"), "no cubin produced"
            except Exception as exc:  # report every failure, not just the first
                failures += 1
                print(f"FAIL {name} sm{capability}: {type(exc).__name__}: {exc}")
                continue
            tensor_cores = "mma" in compiled.asm["ptx"]  # wgmma, mma.sync
            shared = compiled.metadata.shared
            elapsed = time.monotonic() - started
            print(f"ok   {name} sm{capability}: {shared} B shared memory, {elapsed:.1f} s")
    return failures


@pytest.mark.slow
def run_compiling(*module_and_args: str) -> None:
    """``python -m module args`` from the repository's root in a fresh Python without
    the interpreter (the kernels must be real JIT functions); it must succeed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # triton 3.9 warns when it is unset
    result = subprocess.run(
        [sys.executable, "-m", *module_and_args],
        cwd=Path(__file__).resolve().parents[2],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


@pytest.mark.skipif(not nvidia_backend(), reason="needs triton with its NVIDIA backend")
def test_kernels_compile_for_nvidia_gpus():
    run_compiling("tests.kernels.test_triton_compile")


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
