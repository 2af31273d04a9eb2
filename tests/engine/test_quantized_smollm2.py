"""The embedded SmolLM2 with its Q4_1 weights kept quantized (and its weights quantized
to int8 at load), against the same engine on the dequantized weights in fp32.

Teacher-forced on a fixed text (prompt logprobs: every position sees the same
context in both engines), the quantized model must pick the same next token almost
everywhere and reach the same perplexity within 0.5%. Free-running greedy outputs are
compared too, where the activations are fp32 in both.

On a CPU where the quantized kernel does not run (it needs AVX512-VNNI and -BW:
kernels/cpu_isa.py) the engine dequantizes those weights at load instead, and the same
comparisons hold: the tests run there too, checking that the weights were dequantized.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.loader import load_state_dict, resolve_model
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


def teacher_forced(engine: LLMEngine, text: str = TEXT) -> tuple[float, list[int]]:
    """(perplexity of ``text``, the top-1 token predicted at each position)."""
    sampling = SamplingParams(max_tokens=1, prompt_logprobs=1)
    out = engine.generate([text], sampling, use_tqdm=False)[0]
    ids, logprobs = out.prompt_token_ids, out.prompt_logprobs
    own = [logprobs[i][ids[i]] for i in range(1, len(ids))]
    top = [max(logprobs[i], key=logprobs[i].get) for i in range(1, len(ids))]
    return math.exp(-sum(own) / len(own)), top


def greedy(engine: LLMEngine) -> list[list[int]]:
    tokenizer = engine.tokenizer
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        for q in QUESTIONS + [DOCUMENT + q for q in QUESTIONS]
    ]
    sampling = SamplingParams(max_tokens=48, temperature=0)
    return [o.token_ids for o in engine.generate(prompts, sampling, use_tqdm=False)]


@pytest.fixture(scope="module")
def reference() -> tuple[float, list[int], list[list[int]]]:
    engine = build_engine(dtype="float32")  # auto dequantizes in fp32
    assert not any(isinstance(m.packed, QuantizedLinear) for m in linear_layers(engine))
    return (*teacher_forced(engine), greedy(engine))


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


def agreement(a: list[int], b: list[int]) -> float:
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def test_quantized_bf16_matches_fp32_teacher_forced(reference) -> None:
    ppl_ref, top_ref, _ = reference
    engine = build_engine(dtype="bfloat16")
    check_kept_quantized(linear_layers(engine))
    ppl, top = teacher_forced(engine)
    # Measured: perplexity +0.20%, top-1 agreement 97.5% (bf16 on the dequantized
    # weights, no quantized kernel: +0.15%, 97.8%). On a Cascade Lake Xeon (no
    # AVX512-BF16: the bf16 kernels widen pairs for FMAs, and the tiled prefill attention
    # keeps its probabilities in fp32) +0.08%, 95.3%; with per-token attention rows
    # +0.26%, 95.6% with one thread and 96.3% with two, every flip a near-tie of the
    # reference's (<= 0.32 nats).
    assert abs(ppl / ppl_ref - 1) < 0.005
    assert agreement(top, top_ref) > 0.94


def test_quantized_fp32_greedy_matches_dequantized_fp32(reference) -> None:
    ppl_ref, top_ref, greedy_ref = reference
    engine = build_engine(dtype="float32", quantization="gguf")
    check_kept_quantized(linear_layers(engine))
    ppl, top = teacher_forced(engine)
    assert abs(ppl / ppl_ref - 1) < 0.005
    assert agreement(top, top_ref) > 0.97
    outputs = greedy(engine)
    pairs = zip(outputs, greedy_ref, strict=True)
    same = sum(x == y for a, b in pairs for x, y in zip(a, b, strict=False))
    # Free-running, the int8 activations' first near-tie flip changes what follows:
    # 49.6% of the tokens matched on a Cascade Lake Xeon (teacher-forced: 97.5%).
    assert same / sum(len(b) for b in greedy_ref) > 0.4


@pytest.fixture(scope="module")
def safetensors_copy(tmp_path_factory) -> Path:
    """The GGUF's weights dequantized to fp32 (the reference's weights) as a
    safetensors checkpoint (transformers will not save a model it loaded from GGUF)."""
    source = resolve_model(None)
    folder = tmp_path_factory.mktemp("smollm2")
    kwargs = dict(gguf_file=source.gguf_file)
    transformers.AutoTokenizer.from_pretrained(source.folder, **kwargs).save_pretrained(folder)
    transformers.AutoConfig.from_pretrained(source.folder, **kwargs).save_pretrained(folder)
    state_dict = load_state_dict(source, torch.float32)
    save_file(
        {name: t.contiguous() for name, t in state_dict.items()}, folder / "model.safetensors"
    )
    return folder


def test_int8_at_load_matches_fp32_teacher_forced(reference, safetensors_copy) -> None:
    ppl_ref, top_ref, _ = reference
    engine = build_engine(model=str(safetensors_copy), dtype="bfloat16", quantization="int8")
    check_kept_quantized(linear_layers(engine), INT8)
    ppl, top = teacher_forced(engine)
    # Measured: perplexity -0.07%, top-1 agreement 94.8% (fp32 activations: +0.18%,
    # 96.1%). Lower than Q4_1 kept as it is, which computes the reference's own
    # weights: one scale per row of 576+ values re-rounds weights that sit on Q4_1's
    # per-32 grid (0.85% relative error per matrix). On a Cascade Lake Xeon +0.50%,
    # 94.8% with the tiled prefill attention, +0.23%, 96.1% with per-token rows (both
    # in fp32 on bf16 inputs: the order of the sums alone moves these 406 tokens).
    assert abs(ppl / ppl_ref - 1) < 0.0075
    assert agreement(top, top_ref) > 0.93
