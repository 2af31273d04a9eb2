"""A vision-language model's greedy output equals transformers' generate with the same
images, token for token, in fp32: SmolVLM's architecture (Idefics3), Gemma 3's and
Qwen2.5-VL's, each on a tiny random checkpoint (tests/tiny_models.py), under the
scheduling regimes that change how the KV cache is filled (plain, chunked prefill at a
budget that splits an image's tokens, preemption by recompute and by swap, the KV
tiers, two tensor-parallel ranks), with the prefix cache hit on the same image and
missed on a different image behind the same text; plainly and chunked on an NVIDIA GPU
too (marked cuda: make gpu-check runs them). In bf16, each prompt's first token is
transformers' bf16 one.

Gemma 3's image tokens attend to each other both ways: its chunks stop at an image's
edge instead (core/scheduler.py), and its image steps take the torch reference's
attention (AttentionInputs.bidirectional_ends). Qwen2.5-VL's image tokens take M-RoPE's
grid positions, and the text after them positions behind their index.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from hetero_infer.engine import EngineConfig, LLMEngine, SamplingParams
from hetero_infer.engine.frontend.input_processor import PromptTokens
from hetero_infer.engine.models.layers import Linear
from hetero_infer.engine.multimodal.gemma3_images import Gemma3ImageProcessor
from hetero_infer.engine.multimodal.idefics3_images import Idefics3ImageProcessor
from hetero_infer.engine.multimodal.qwen2_vl_images import Qwen2VLImageProcessor
from hetero_infer.engine.settings.exceptions import ConfigError, ValidationError
from hetero_infer.kernels import cpu_isa
from hetero_infer.kernels.linear import TorchLinear
from PIL import Image

from tests.tiny_models import (
    pil_processor,
    qwen2_5_vl_processor,
    save_tiny_gemma3_vision,
    save_tiny_idefics3,
    save_tiny_qwen2_5_vl,
)

MAX_NEW_TOKENS = 12
REQUEST_IDS = itertools.count()
EOS = 2


def noise_image(seed: int, width: int, height: int) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


# (question, images): split into tiles and not, two images in one prompt.
CASES = [
    ("What is this?", [noise_image(1, 150, 100)]),
    ("Describe it.", [noise_image(2, 40, 60)]),
    ("Compare them.", [noise_image(3, 90, 200), noise_image(4, 64, 64)]),
]


def messages(question: str, num_images: int) -> list[dict]:
    parts = [{"type": "image"}] * num_images + [{"type": "text", "text": question}]
    return [{"role": "user", "content": parts}]


@dataclass(frozen=True)
class Family:
    save: Any  # (folder) -> the tiny checkpoint's folder
    model_class: Any  # transformers' class
    processor_class: Any  # ours
    # The recompute and swap regimes' KV pool: the first two prompts fill it, and
    # their answers take more.
    pool: dict[str, int]
    eos: tuple[int, ...] = (EOS,)
    processor: Any = pil_processor  # (folder) -> transformers'


FAMILIES = {
    # Prompts of ~270 tokens (tiles of 16 image tokens).
    "idefics3": Family(
        save_tiny_idefics3,
        transformers.Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        dict(block_size=8, max_num_blocks=70, max_model_len=540),
    ),
    # Prompts of ~50 tokens (16 image tokens), each seen by a 24-token sliding window;
    # the family's end of turn <end_of_turn> (385) stops it too.
    "gemma3": Family(
        save_tiny_gemma3_vision,
        transformers.Gemma3ForConditionalGeneration,
        Gemma3ImageProcessor,
        dict(block_size=8, max_num_blocks=14, max_model_len=112),
        eos=(EOS, 385),
    ),
    # Prompts of ~70-150 tokens (an image's patch grid merged 2 x 2); <|im_end|> (385)
    # ends a turn.
    "qwen2_5_vl": Family(
        save_tiny_qwen2_5_vl,
        transformers.Qwen2_5_VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        dict(block_size=8, max_num_blocks=22, max_model_len=176),
        eos=(EOS, 385),
        processor=qwen2_5_vl_processor,
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def reference(request, tmp_path_factory):
    """(family, folder, reference): reference(question, images) -> (the processor's
    prompt ids, transformers' greedy output ids)."""
    family = FAMILIES[request.param]
    folder = family.save(tmp_path_factory.mktemp(request.param))
    processor = family.processor(folder)
    model = family.model_class.from_pretrained(folder, dtype=torch.float32).eval()

    def generate(question: str, images: list) -> tuple[list[int], list[int]]:
        text = processor.apply_chat_template(
            messages(question, len(images)), add_generation_prompt=True
        )
        # The template writes the BOS: the text is tokenized as the server tokenizes a
        # chat's, without the tokenizer's own special tokens.
        inputs = processor(text=text, images=images, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(
                **inputs,
                max_new_tokens=MAX_NEW_TOKENS,
                do_sample=False,
                eos_token_id=list(family.eos),
            )
        prompt = inputs["input_ids"][0].tolist()
        return prompt, out[0, len(prompt) :].tolist()

    return family, folder, generate


@pytest.fixture(scope="module")
def vlm(reference):
    """(family, folder, [(the processor's prompt ids, transformers' output ids)] for
    CASES)."""
    family, folder, generate = reference
    return family, folder, [generate(question, images) for question, images in CASES]


def engine_prompt(engine: LLMEngine, question: str, images: list) -> PromptTokens:
    """The prompt as the server makes it: the chat template, then the images."""
    token_ids = engine.tokenizer.apply_chat_template(messages(question, len(images)), True)
    processor = engine.input_processor
    return processor.with_images(processor.tokenize(token_ids), images)


def run(engine: LLMEngine, prompts: list[PromptTokens]) -> list[list[int]]:
    params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=0.0)
    ids = [
        engine.add_processed(engine.input_processor.request(f"r{next(REQUEST_IDS)}", p, params))
        for p in prompts
    ]
    while engine.has_pending_work():
        engine.step()
    return [engine.get_output(i).token_ids for i in ids]


def regime_settings(family: Family, regime: str, tmp_path) -> tuple[dict, str | None]:
    """The engine settings of a scheduling regime, and a counter it must move."""
    if regime == "plain":
        return {}, None
    if regime == "chunked":  # 16 tokens a step: image placeholders span several steps
        return dict(max_num_batched_tokens=16), None
    pool = dict(**family.pool, memory_threshold=1.0)
    if regime == "recompute":
        return pool, "num_preemptions"
    if regime == "swap":
        return dict(**pool, num_cpu_blocks=200), "num_preemptions"
    # The recompute regime's pool with the prefix cache's RAM and disk tiers: the
    # second pass takes the image blocks back from them.
    tiers = dict(kv_offloading_size=0.004, kv_offloading_dir=str(tmp_path))
    return dict(**pool, **tiers), "kv_tier_hit_tokens"


@pytest.mark.parametrize("regime", ["chunked", "plain", "recompute", "swap", "tiers"])
def test_greedy_matches_transformers_with_images(vlm, regime, tmp_path):
    family, folder, cases = vlm
    settings, must_happen = regime_settings(family, regime, tmp_path)
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", **settings))
    prompts = [engine_prompt(engine, q, images) for q, images in CASES]
    for prompt, (expected_prompt, _) in zip(prompts, cases, strict=True):
        assert prompt.token_ids == expected_prompt  # the processor's expansion
    expected = [ref for _, ref in cases]
    assert run(engine, prompts) == expected
    # The second pass, last prompt first (the blocks the pool kept last), hits the
    # prefix cache, image tokens included.
    assert run(engine, prompts[::-1]) == expected[::-1]
    stats = {**engine.metrics.as_dict(), **engine.memory_stats()}
    if must_happen:
        assert stats[must_happen] > 0
    assert stats["prefix_cache_hits"] > 0
    assert stats["used_blocks"] == 0 and stats["num_sequences"] == 0


@pytest.mark.cuda
@pytest.mark.parametrize("regime", ["plain", "chunked"])
def test_greedy_on_cuda_matches_transformers_with_images(vlm, regime, tmp_path):
    """The same on an NVIDIA GPU: the compiled Triton kernels, CUDA graphs for decodes,
    a KV pool of its own size (make gpu-check's test workers share the GPU)."""
    from tests.engine.worker.test_cuda_graphs import skip_unless_compiled_triton

    skip_unless_compiled_triton()
    family, folder, cases = vlm
    settings, _ = regime_settings(family, regime, tmp_path)
    pool = dict(max_num_seqs=8, max_num_blocks=256, max_model_len=1024)
    config = EngineConfig(model=str(folder), dtype="float32", device="cuda", **pool, **settings)
    engine = LLMEngine(config)
    prompts = [engine_prompt(engine, q, images) for q, images in CASES]
    expected = [ref for _, ref in cases]
    for _ in range(2):  # the second pass hits the prefix cache
        assert run(engine, prompts) == expected
    stats = engine.memory_stats()
    assert stats["prefix_cache_hits"] > 0 and stats["used_blocks"] == 0


def test_an_embedding_of_a_prompt_with_images_is_transformers_hidden_state(reference):
    """An embedding request carries its prompt's images (/v1/embeddings' messages): its
    vector, left unnormalized, is transformers' final hidden state of the last token
    (the language model's, after its final norm) with the same images."""
    family, folder, _ = reference
    question, images = CASES[0]
    processor = family.processor(folder)
    text = processor.apply_chat_template(
        messages(question, len(images)), add_generation_prompt=True
    )
    inputs = processor(text=text, images=images, return_tensors="pt", add_special_tokens=False)
    model = family.model_class.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        expected = model.model(**inputs).last_hidden_state[0, -1]
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    prompt = engine_prompt(engine, question, images)
    engine.add_processed(engine.input_processor.embedding_request("e", prompt, normalize=False))
    while engine.has_pending_work():
        engine.step()
    got = torch.tensor(engine.get_output("e").embedding)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), (got - expected).abs().max()


def test_prefix_cache_tells_images_apart(reference, vlm):
    """The same text with another image hits only the blocks before the image; the
    same image again hits past it. Each answers as transformers does."""
    (_, folder, generate), (_, _, cases) = reference, vlm
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", block_size=8))
    question, images = CASES[0]
    first = engine_prompt(engine, question, images)
    other_image = noise_image(99, 150, 100)  # the same size: the same placeholder tokens
    other = engine_prompt(engine, question, [other_image])
    assert other.token_ids == first.token_ids

    def hit_tokens(prompt: PromptTokens) -> tuple[int, list[int]]:
        before = engine.memory_stats()["prefix_cache_hits"]
        (out,) = run(engine, [prompt])
        return engine.memory_stats()["prefix_cache_hits"] - before, out

    assert hit_tokens(first) == (0, cases[0][1])
    hits, out = hit_tokens(other)
    assert hits <= first.images[0].start
    assert out == generate(question, [other_image])[1]
    hits, again = hit_tokens(first)
    assert hits > first.images[0].end - 8 and again == cases[0][1]


def test_tensor_parallel_ranks_take_rank_0s_image_embeddings(vlm):
    """Two ranks: rank 0 runs the vision tower and sends the embeddings (and Gemma 3's
    image spans) with the step; chunks split the prompts, the second pass hits."""
    _, folder, cases = vlm
    config = EngineConfig(
        model=str(folder), dtype="float32", tensor_parallel_size=2, max_num_batched_tokens=16
    )
    engine = LLMEngine(config)
    try:
        prompts = [engine_prompt(engine, q, images) for q, images in CASES]
        for _ in range(2):
            assert run(engine, prompts) == [ref for _, ref in cases]
        assert engine.memory_stats()["prefix_cache_hits"] > 0
    finally:
        engine.shutdown()


def test_a_second_question_about_an_image_reuses_its_preprocessing(vlm, monkeypatch):
    family, folder, _ = vlm
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    processed, original = [], family.processor_class.process_rgb

    def process_rgb(self, rgb):
        processed.append(rgb.size)
        return original(self, rgb)

    monkeypatch.setattr(family.processor_class, "process_rgb", process_rgb)
    image = noise_image(5, 120, 90)
    first = engine_prompt(engine, "What is this?", [image])
    again = engine_prompt(engine, "And its colours?", [image.copy()])
    other = engine_prompt(engine, "What is this?", [noise_image(6, 120, 90)])
    assert len(processed) == 2  # the copy was not resized again
    assert first.images[0].content_hash == again.images[0].content_hash
    assert other.images[0].content_hash != first.images[0].content_hash
    assert torch.equal(first.images[0].pixel_values, again.images[0].pixel_values)


def test_a_step_budget_short_of_an_image_is_refused_where_it_is_seen_both_ways(vlm):
    """Gemma 3 computes an image's 16 tokens in one step: 8 a step could never; SmolVLM's
    causal images are split anywhere."""
    family, folder, _ = vlm
    config = EngineConfig(model=str(folder), dtype="float32", max_num_batched_tokens=8)
    if family.processor_class is Gemma3ImageProcessor:
        with pytest.raises(ConfigError, match=r"must hold one image's 16 tokens"):
            LLMEngine(config)
    else:
        assert LLMEngine(config).model_config.vision.bidirectional_tokens == 0


def test_a_prompt_longer_than_the_context_once_its_images_expand_is_refused(vlm):
    """The text fits; the image's placeholder tokens take it past max_model_len. The
    input processor refuses the request it would hand to add_processed, whatever route
    built the prompt."""
    family, folder, _ = vlm
    question, images = next((q, i) for q, i in CASES if i)
    probe = LLMEngine(EngineConfig(model=str(folder), dtype="float32"))
    expanded = len(engine_prompt(probe, question, images).token_ids)
    text_only = len(probe.tokenizer.apply_chat_template(messages(question, len(images)), True))
    assert text_only < expanded - 1  # the images add tokens
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", max_model_len=expanded - 1))
    prompt = engine_prompt(engine, question, images)
    params = SamplingParams(max_tokens=1)
    with pytest.raises(ValidationError, match="longer than max_model_len"):
        engine.input_processor.request("too-long", prompt, params)


def test_bf16_starts_as_transformers_in_bf16(vlm):
    """The dtype a vision model runs in on a CPU by default: bf16, on the C++ kernels
    (the fp32 runs above take torch's code for much of a layer). Each prompt with its
    images starts with the token transformers' bf16 model gives first; rounding parts
    the two a few tokens on, as it parts either from fp32."""
    family, folder, _ = vlm
    processor = family.processor(folder)
    model = family.model_class.from_pretrained(folder, dtype=torch.bfloat16).eval()
    expected = []
    for question, images in CASES:
        text = processor.apply_chat_template(
            messages(question, len(images)), add_generation_prompt=True
        )
        inputs = processor(text=text, images=images, return_tensors="pt", add_special_tokens=False)
        inputs = {k: v.bfloat16() if v.is_floating_point() else v for k, v in inputs.items()}
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=1, do_sample=False)
        expected.append(out[0, -1:].tolist())
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16"))
    outputs = run(engine, [engine_prompt(engine, q, images) for q, images in CASES])
    assert [out[:1] for out in outputs] == expected


def test_the_vision_side_runs_on_the_text_models_kernels(vlm):
    """Every projection of the vision side is packed by the engine's kernels, as the
    text model's are: in bf16 on a CPU where our bf16 kernel runs (AVX-512), ours or
    oneDNN's on a packed copy, not torch's F.linear on the checkpoint's weight."""
    _, folder, _ = vlm
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16"))
    model = engine.core.runner.model
    linears = [m for m in model.vision.modules() if isinstance(m, Linear)]
    assert len(linears) >= 5  # two layers' attention and MLP, at least
    expected = {type(model.kernels.ops.pack_linear(m.weight, m.bias)) for m in linears}
    assert {type(m.packed) for m in linears} == expected
    if cpu_isa.kernel_unavailable("linear_packed") is None:
        assert TorchLinear not in expected
