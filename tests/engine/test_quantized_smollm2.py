"""The embedded SmolLM2 with its Q4_1 weights kept quantized (and its weights quantized
to int8 at load), against the same engine on the dequantized weights in fp32.

Teacher-forced on a fixed text (prompt logprobs: every position sees the same context
in both engines, and both score the same tokens), each token's logprob must stay close
to fp32's: the mean |change| per token, and the perplexity. Greedy decoding is measured
alike, where the activations are fp32 in both: the reference scores the tokens the
quantized engine chose as it decoded, so a first differing pick does not part the rest.

Why not the share of top-1 picks that agree: it counts the near-ties that flipped, a
dozen of some 400 tokens, which any change in the order of a kernel's sums moves by a
few (95.3% to 97.8% for the same bf16 run across CPUs and kernels), so its floors were
lowered CPU by CPU. The mean change averages every token (its standard error is ~5% of
it), and what sets it is the format's rounding of each value (bf16's 8 significant
bits, int8's 255 steps), which every CPU's kernels do alike; where they round the
intermediates differently (attention probabilities in bf16 or in fp32) they add or
leave out a few roundings of the same size. Each bound sits about 1.5x above the error
its format gives, and below what the format one bit coarser gives (every rounding
twice as large): a wrong scale or a coarser rounding fails it.

On a CPU where the quantized kernel does not run (it needs AVX2, FMA and F16C:
kernels/cpu_isa.py) the engine dequantizes those weights at load instead, and the same
comparisons hold: the tests run there too, checking that the weights were dequantized.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.loader import load_state_dict, resolve_model
from hetero_infer.engine.loader.gguf_metadata import gguf_metadata_folder
from hetero_infer.kernels.cpu_isa import kernel_unavailable
from hetero_infer.kernels.linear_quantized import QuantizedLinear
from hetero_infer.kernels.quantized import INT8
from safetensors.torch import save_file

from tests.engine.test_smollm2 import DOCUMENT, QUESTIONS

pytestmark = pytest.mark.slow

TEXT = (Path(__file__).parent / "data" / "printing_press.txt").read_text()
# Whether the engine keeps the weights quantized for the kernel (else it dequantizes them).
QUANTIZED_KERNEL = kernel_unavailable("quantized_linear") is None


def build_engine(**settings) -> LLMEngine:
    return LLMEngine(EngineConfig(max_num_blocks=512, max_model_len=2048, **settings))


def teacher_forced(engine: LLMEngine, text: str = TEXT) -> list[float]:
    """The logprob ``engine`` gives each token of ``text`` after the first, given the
    tokens before it."""
    sampling = SamplingParams(max_tokens=1, prompt_logprobs=0)
    out = engine.generate([text], sampling, use_tqdm=False)[0]
    ids, logprobs = out.prompt_token_ids, out.prompt_logprobs
    return [logprobs[i][ids[i]] for i in range(1, len(ids))]


def logprob_change(reference: list[float], logprobs: list[float]) -> float:
    """The mean |change| of the same tokens' logprobs, in nats."""
    pairs = zip(reference, logprobs, strict=True)
    return sum(abs(a - b) for a, b in pairs) / len(reference)


def perplexity_change(reference: list[float], logprobs: list[float]) -> float:
    """The relative change of the same tokens' perplexity."""
    return math.exp((sum(reference) - sum(logprobs)) / len(reference)) - 1


def greedy_scored(engine: LLMEngine, reference: LLMEngine) -> tuple[list[float], list[float]]:
    """(``reference``'s logprobs of ``engine``'s greedy tokens, teacher-forced on them;
    ``engine``'s own, each as it decoded it)."""
    tokenizer = engine.tokenizer
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True
            )
        )
        for q in QUESTIONS + [DOCUMENT + q for q in QUESTIONS]
    ]
    sampling = SamplingParams(max_tokens=48, temperature=0, logprobs=0)
    outputs = engine.generate(prompts, sampling, use_tqdm=False)
    forced = [prompt + out.token_ids for prompt, out in zip(prompts, outputs, strict=True)]
    scoring = SamplingParams(max_tokens=1, prompt_logprobs=0)
    scored = reference.generate(forced, scoring, use_tqdm=False)
    theirs, own = [], []
    for prompt, out, ref in zip(prompts, outputs, scored, strict=True):
        for i, token in enumerate(out.token_ids):
            theirs.append(ref.prompt_logprobs[len(prompt) + i][token])
            own.append(out.logprobs[i][token])
    return theirs, own


@pytest.fixture(scope="module")
def reference() -> tuple[list[float], LLMEngine]:
    """fp32's teacher-forced logprobs, and its engine (to score other engines' tokens)."""
    engine = build_engine(dtype="float32")  # auto dequantizes in fp32
    assert not any(isinstance(m.packed, QuantizedLinear) for m in linear_layers(engine))
    return teacher_forced(engine), engine


def linear_layers(engine: LLMEngine) -> list:
    model = engine.runner.model
    return [layer.mlp.down_proj for layer in model.layers] + [
        layer.self_attn.qkv_proj for layer in model.layers
    ]


def check_kept_quantized(layers: list, qtype: str | None = None) -> None:
    """The layers run the quantized kernel on their blocks (of ``qtype``) with no
    dequantized copy kept, where it runs here; else they hold dequantized weights."""
    if QUANTIZED_KERNEL:
        assert all(isinstance(m.packed, QuantizedLinear) for m in layers)
        assert all(qtype is None or m.packed.qtype == qtype for m in layers)
        assert all(m.weight.numel() == 0 for m in layers)
    else:
        assert not any(isinstance(m.packed, QuantizedLinear) for m in layers)
        assert all(m.weight.numel() > 0 for m in layers)


def test_quantized_bf16_matches_fp32_teacher_forced(reference) -> None:
    fp32, _ = reference
    engine = build_engine(dtype="bfloat16")
    check_kept_quantized(linear_layers(engine))
    logprobs = teacher_forced(engine)
    # Measured (406 tokens): on the dequantized weights (AVX2, torch's bf16 kernels)
    # mean |change| 0.031 nats, perplexity -0.18%; kept quantized, the kernel's int8
    # activations per 32 values (its torch reference in their place) round more than
    # bf16 does: 0.066, +0.44%. Which of the two runs is the CPU's ISA's choice, and the
    # bound is that format's. The perplexity moves by rms / sqrt(406) per run (0.2%,
    # 0.45%) with any rounding change; top-1 agreement was 95.3-97.8% across CPUs. The
    # logits are bf16 (a step of 0.06 nats near 10), so a change far below them moves
    # tokens by a step: on an AVX2 EPYC, attention by matrix products instead of rows
    # (the same results but for one bf16 ulp in 0.03% of the values) moved the
    # logprobs by 0.075 nats on average and the perplexity change from +0.47% to +1.08%.
    change = logprob_change(fp32, logprobs)
    assert change < (0.1 if QUANTIZED_KERNEL else 0.05), change
    assert abs(perplexity_change(fp32, logprobs)) < 0.015


def test_quantized_fp32_greedy_matches_dequantized_fp32(reference) -> None:
    fp32, fp32_engine = reference
    engine = build_engine(dtype="float32", quantization="gguf")
    check_kept_quantized(linear_layers(engine))
    logprobs = teacher_forced(engine)
    # The kernel's int8 activations per 32 values are the only rounding fp32 does not
    # do: with its torch reference in its place, mean |change| 0.057 nats, perplexity
    # +0.50% teacher-forced, and 0.032 on the 446 tokens greedy decoding chose for the
    # 12 prompts (its own picks, mostly confident: less to move).
    # Without the kernel both engines run the same fp32 weights: 0 here.
    most = 0.09 if QUANTIZED_KERNEL else 1e-4
    change = logprob_change(fp32, logprobs)
    assert change < most, change
    assert abs(perplexity_change(fp32, logprobs)) < 0.01
    # Greedy: the reference scores the tokens this engine chose as it decoded them
    # (without the kernel the two are one engine, whose decoding against its prefill
    # test_exactness.py holds to transformers').
    if QUANTIZED_KERNEL:
        theirs, own = greedy_scored(engine, fp32_engine)
        change = logprob_change(theirs, own)
        assert change < 0.05, change


@pytest.fixture(scope="module")
def safetensors_copy(tmp_path_factory) -> Path:
    """The GGUF's weights dequantized to fp32 (the reference's weights) as a
    safetensors checkpoint (transformers will not save a model it loaded from GGUF)."""
    source = resolve_model(None)
    # the config and tokenizer as transformers converts them from the file
    folder = tmp_path_factory.mktemp("smollm2") / "model"
    shutil.copytree(gguf_metadata_folder(source), folder)
    state_dict = load_state_dict(source, torch.float32)
    save_file(
        {name: t.contiguous() for name, t in state_dict.items()}, folder / "model.safetensors"
    )
    return folder


def test_int8_at_load_matches_fp32_teacher_forced(reference, safetensors_copy) -> None:
    fp32, _ = reference
    engine = build_engine(model=str(safetensors_copy), dtype="bfloat16", quantization="int8")
    check_kept_quantized(linear_layers(engine), INT8)
    logprobs = teacher_forced(engine)
    # Measured: mean |change| 0.066 nats, perplexity +0.07% (fp32 activations: 0.058,
    # +0.01%). Larger than Q4_1 kept as it is, which computes the reference's own
    # weights: one scale per row of 576+ values re-rounds weights that sit on Q4_1's
    # per-32 grid (0.85% relative error per matrix); the int8 rounding's 0.058 and
    # bf16's 0.031 add up as independent errors (sqrt(0.058^2 + 0.031^2) = 0.066).
    # The perplexity of these tokens moves by several 0.1% with the order of the sums
    # (+0.23% to +0.50% on a Cascade Lake Xeon; on a Xeon with AMX +0.28% with the
    # AVX-512 prefill attention, +0.89% with AMX's, the mean |change| 0.079 and 0.080):
    # the signed mean of a few hundred tokens' changes of ~0.08 each.
    change = logprob_change(fp32, logprobs)
    assert change < 0.1, change
    assert abs(perplexity_change(fp32, logprobs)) < 0.012
