"""Tiny random-weight checkpoints of each family for exactness tests: Llama, Mistral,
Qwen2, Qwen3, Gemma 2, Gemma 3 and Phi-3, and the mixture-of-experts families Mixtral,
Qwen2-MoE (Qwen1.5-MoE), Qwen3-MoE and OLMoE; and the vision-language Idefics3
(SmolVLM's architecture), Gemma 3 (Gemma3ForConditionalGeneration) and Qwen2.5-VL, each
with its image processor.

Sizes are chosen to be awkward: head_dim not a power of two, one KV head, a GQA
ratio of 3, odd layer counts. Weights are drawn with a large init range so that
logits are peaked: near-ties would make greedy argmax depend on rounding, and
the comparison with transformers would test noise instead of the engine.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
import transformers

from tests.helpers import BYTE_FALLBACK_VOCAB_SIZE, make_byte_fallback_tokenizer

COMMON = dict(
    vocab_size=BYTE_FALLBACK_VOCAB_SIZE,
    max_position_embeddings=1024,
    initializer_range=0.5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
    tie_word_embeddings=False,
)


def longrope_parameters(head_dim: int) -> dict:
    """LongRoPE with distinct short and long factors per frequency."""
    half = head_dim // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.05 * i for i in range(half)],
        "long_factor": [1.5 + 0.4 * i for i in range(half)],
    }


TINY_MODELS = {
    # head_dim 24, one KV head (GQA ratio 3), 3 layers, Llama-3 rope scaling
    "llama": lambda: transformers.LlamaConfig(
        hidden_size=72,
        intermediate_size=112,
        num_hidden_layers=3,
        num_attention_heads=3,
        num_key_value_heads=1,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
        **{**COMMON, "tie_word_embeddings": True},
    ),
    # head_dim 20, GQA ratio 3, 5 layers
    "mistral": lambda: transformers.MistralConfig(
        hidden_size=120,
        intermediate_size=160,
        num_hidden_layers=5,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=20,
        sliding_window=None,
        **COMMON,
    ),
    # q/k/v biases, head_dim 12, no GQA, 3 layers
    "qwen2": lambda: transformers.Qwen2Config(
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        **COMMON,
    ),
    # q/k norms, head_dim 24 (q is wider than hidden), GQA ratio 2, 3 layers, tied
    # embeddings (as Qwen3-0.6B's)
    "qwen3": lambda: transformers.Qwen3Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        **{**COMMON, "tie_word_embeddings": True},
    ),
    # Gemma 2: Gemma 3's layer without q/k norms, one RoPE base, sliding layers of 8
    # tokens (shorter than the prompts) alternating with global ones, and soft-capping
    # that matters at these weights: attention's scaled scores are ~12 (up to ~90), so
    # a cap of 10 changes most of them (and half the greedy tokens); the top logits,
    # 12 to 18, become 8 to 9.5 (the logprobs change, not the order: a cap below ~8
    # would crowd the top logits within a few ulps of each other, where rounding picks
    # the token). head_dim 32: bf16 prefill chunks on the global layers take the tiled
    # kernel.
    "gemma2": lambda: transformers.Gemma2Config(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=8,
        query_pre_attn_scalar=24,
        attn_logit_softcapping=10.0,
        final_logit_softcapping=10.0,
        **COMMON,
    ),
    # Gemma 3: sliding layers of 8 tokens (shorter than the prompts) around a global
    # one, each kind with its RoPE base; q/k norms, norms after attention and the MLP,
    # GeGLU, a scaled embedding, query_pre_attn_scalar. Untied: tied to an embedding
    # scaled by sqrt(hidden), random weights would predict the last token again and again
    "gemma3": lambda: transformers.Gemma3TextConfig(
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=8,
        layer_types=[
            "sliding_attention",
            "sliding_attention",
            "full_attention",
            "sliding_attention",
        ],
        query_pre_attn_scalar=24,
        **COMMON,
    ),
    # Phi-3: q/k/v and gate/up fused in the checkpoint, LongRoPE (the short factors:
    # these prompts stay within the original 512 positions; the attention factor of
    # 1024 / 512 applies; tests/engine/test_longrope.py takes them past it), GQA ratio 2,
    # and as Phi-4-mini RoPE on 3/4 of each head (18 of 24 dims)
    "phi3": lambda: transformers.Phi3Config(
        hidden_size=96,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        original_max_position_embeddings=512,
        rope_parameters={**longrope_parameters(head_dim=18), "partial_rotary_factor": 0.75},
        **COMMON,
    ),
    # Mixtral: 8 experts, 2 per token (renormalized), GQA ratio 3, head_dim 16
    "mixtral": lambda: transformers.MixtralConfig(
        hidden_size=96,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        **COMMON,
    ),
    # Qwen1.5-MoE's layout: q/k/v biases, a sigmoid-gated shared expert, top-4 of 10
    # without renormalizing, and a dense MLP in layer 1 (mlp_only_layers) between sparse
    # ones
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=10,
        num_experts_per_tok=4,
        norm_topk_prob=False,
        mlp_only_layers=[1],
        **COMMON,
    ),
    # Qwen3-MoE: q/k norms per head, top-3 of 8 renormalized, sparse every second layer
    # (decoder_sparse_step 2: layers 1 and 3), head_dim 24
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        num_experts=8,
        num_experts_per_tok=3,
        norm_topk_prob=True,
        decoder_sparse_step=2,
        **COMMON,
    ),
    # OLMoE: q/k norms across all heads, top-3 of 12 without renormalizing, no GQA
    "olmoe": lambda: transformers.OlmoeConfig(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts=12,
        num_experts_per_tok=3,
        **COMMON,
    ),
}
# The mixture-of-experts ones among them. Their experts' and shared experts' widths are
# multiples of 32 and their projections' outputs of 16, so that the quantized kernels
# take them (kernels/moe_cpu.py).
MOE_MODELS = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
# Families whose RMSNorm weights are drawn at random too (a norm's weight of ones, or of
# Gemma's zeros, would hide a weight applied wrongly).
RANDOM_NORMS = ("qwen3", "gemma2", "gemma3", "qwen3_moe", "olmoe")


def save_tiny_model(name: str, folder: Path, seed: int = 0, **overrides: object) -> Path:
    """Write a random-weight checkpoint with a tokenizer into ``folder``; ``overrides``
    change the config's fields (e.g. ``tie_word_embeddings=True``)."""
    torch.manual_seed(seed)
    config = TINY_MODELS[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # random biases too, so a missing bias would show
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(0, 0.5)
            elif name in RANDOM_NORMS and "norm" in param_name:
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    make_byte_fallback_tokenizer().save_pretrained(folder)
    return folder


def save_perturbed_copy(folder: Path, out: Path, scale: float, seed: int = 1) -> Path:
    """A copy of the checkpoint in ``folder`` with every weight moved by Gaussian noise
    of ``scale`` times its own spread: a model that agrees with the original often but
    not always (a speculative decoding draft whose drafts are partly accepted). A
    mixture-of-experts model's routers stay as they are."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    if model.config.model_type in MOE_MODELS:
        scale /= 2  # a moved hidden state also moves its experts: agreement falls faster
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                continue  # a router moved flips experts: the draft would agree too rarely
            param.add_(torch.randn_like(param) * scale * param.std())
    model.save_pretrained(out)
    make_byte_fallback_tokenizer().save_pretrained(out)
    return out


# Idefics3 (SmolVLM): the prompt's image markers, each a single added special token.
IDEFICS3_IMAGE_TOKENS = (
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    "<end_of_utterance>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)
# SmolVLM's template's shape: "User:<image>question<end_of_utterance>\nAssistant:", a
# space after the colon only when the message starts with text.
IDEFICS3_CHAT_TEMPLATE = (
    "<s>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}: {{ message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}:{% else %}: {% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}"
)
# 64-pixel tiles of 8x8 patches of 8 pixels; the pixel shuffle's scale factor 2 makes each
# tile 16 image tokens. An image's longest edge is first resized to 4 tiles.
IDEFICS3_TILE_SIZE = 64


def save_tiny_llama_in_panels(folder: Path) -> Path:
    """The tiny Llama with every projection a multiple of 32 outputs wide, so that our
    bf16 linear kernel (kernels/linear_cpu.py) takes them all."""
    return save_tiny_model(
        "llama", folder, hidden_size=64, intermediate_size=128, num_attention_heads=4, head_dim=16
    )


def save_tiny_idefics3(folder: Path, seed: int = 0) -> Path:
    """Write a random-weight Idefics3ForConditionalGeneration (SmolVLM's architecture: a
    SigLIP vision tower, a pixel-shuffle connector and a Llama text model) with its
    tokenizer, image processor, processor and chat template into ``folder``."""
    torch.manual_seed(seed)
    tokenizer = make_byte_fallback_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(IDEFICS3_IMAGE_TOKENS)})
    tokenizer.chat_template = IDEFICS3_CHAT_TEMPLATE
    # head_dim 16, GQA ratio 2, 2 layers
    text_config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        **{**COMMON, "vocab_size": len(tokenizer)},
    )
    # head_dim 8, 2 layers
    vision_config = transformers.Idefics3VisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IDEFICS3_TILE_SIZE,
        patch_size=8,
        initializer_range=0.5,
    )
    config = transformers.Idefics3Config(
        text_config=text_config,
        vision_config=vision_config,
        scale_factor=2,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
    )
    model = transformers.Idefics3ForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():  # random biases and norms too, so a missing one would show
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(0, 0.5)
            elif "norm" in param_name:
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    image_processor = transformers.Idefics3ImageProcessorPil(
        size={"longest_edge": 4 * IDEFICS3_TILE_SIZE},
        max_image_size={"longest_edge": IDEFICS3_TILE_SIZE},
    )
    processor = transformers.Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=(IDEFICS3_TILE_SIZE // 8) ** 2 // 2**2,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    return folder


# Gemma 3's chat markers and image tokens, each a single added special token: the prompt
# holds <start_of_image> where an image goes, which Gemma3Processor expands to
# "\n\n<start_of_image>" + <image_soft_token> x mm_tokens_per_image + "<end_of_image>\n\n".
GEMMA3_SPECIAL_TOKENS = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
# The tokenizer attributes Gemma3Processor reads (boi_token, image_token ... and their ids).
GEMMA3_NAMED_TOKENS = {
    "boi_token": "<start_of_image>",
    "eoi_token": "<end_of_image>",
    "image_token": "<image_soft_token>",
}
# Gemma 3's template's shape, with this tokenizer's bos <s>: "<s><start_of_turn>user\n"
# the message's parts (an image as <start_of_image>) "<end_of_turn>\n", the assistant's
# turns as "model".
GEMMA3_CHAT_TEMPLATE = (
    "<s>{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}<start_of_image>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
# 32-pixel images of 8x8 patches of 4 pixels, average-pooled 2x2 into 4x4 = 16 tokens.
GEMMA3_IMAGE_SIZE = 32
GEMMA3_TOKENS_PER_IMAGE = 16


def save_tiny_gemma3_vision(folder: Path, seed: int = 0) -> Path:
    """Write a random-weight Gemma3ForConditionalGeneration (a SigLIP vision tower, an
    average-pooling projector and a Gemma 3 text model) with its tokenizer, image
    processor, processor and chat template into ``folder``."""
    torch.manual_seed(seed)
    tokenizer = make_byte_fallback_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(GEMMA3_SPECIAL_TOKENS)})
    tokenizer.save_pretrained(folder)
    # Named on loading (a "*_token" argument becomes an attribute, saved with it).
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, **GEMMA3_NAMED_TOKENS)
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    # head_dim 16, GQA ratio 2; sliding layers of 24 tokens (shorter than an image's
    # prompt) around a global one, each kind with its RoPE base
    text_config = transformers.Gemma3TextConfig(
        hidden_size=64,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=24,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        query_pre_attn_scalar=24,
        **{**COMMON, "vocab_size": len(tokenizer)},
    )
    # head_dim 8, 2 layers, no pooling head (Gemma 3's tower has none)
    vision_config = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=GEMMA3_IMAGE_SIZE,
        patch_size=4,
        vision_use_head=False,
    )
    config = transformers.Gemma3Config(
        text_config=text_config,
        vision_config=vision_config,
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        boi_token_index=tokenizer.boi_token_id,
        eoi_token_index=tokenizer.eoi_token_id,
        image_token_index=tokenizer.image_token_id,
        initializer_range=0.5,
        tie_word_embeddings=False,  # as the text Gemma 3's (TINY_MODELS): peaked logits
    )
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():  # random biases and norms too, so a missing one would show
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(0, 0.5)
            elif "norm" in param_name:
                param.add_(torch.randn_like(param) * 0.2)
            elif param_name.endswith("mm_input_projection_weight"):  # zeros as initialized
                param.normal_(0, 0.5)
    model.save_pretrained(folder)
    image_processor = transformers.Gemma3ImageProcessorPil(
        size={"height": GEMMA3_IMAGE_SIZE, "width": GEMMA3_IMAGE_SIZE}
    )
    processor = transformers.Gemma3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE,
        chat_template=GEMMA3_CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    return folder


# Qwen2.5-VL's chat markers and vision tokens, each a single added special token: the
# prompt holds <|vision_start|><|image_pad|><|vision_end|> where an image goes, whose one
# <|image_pad|> Qwen2_5_VLProcessor repeats once per merged patch of the image.
QWEN2_5_VL_SPECIAL_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen's template's shape, without the default system prompt: "<|im_start|>user\n" the
# message's parts "<|im_end|>\n", then "<|im_start|>assistant\n".
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Patches of 4 pixels merged 2 x 2 into one token; windows of 16 pixels (2 x 2 tokens), so
# that a 32 x 48 image's 4 x 6 tokens attend in 6 windows on the windowed layer. An image
# is resized to multiples of 8 pixels, between 16 * 16 and 64 * 64 pixels in all.
QWEN2_5_VL_PATCH_SIZE = 4
QWEN2_5_VL_MERGE_SIZE = 2
QWEN2_5_VL_MROPE_SECTION = (2, 3, 3)  # of head_dim 16's 8 frequencies: t, h, w


class ImageOnlyProcessor(transformers.Qwen2_5_VLProcessor):
    """Qwen2_5_VLProcessor without its video processor, which needs torchvision."""

    def check_argument_for_proper_class(self, argument_name: str, argument: object) -> object:
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)


def pil_processor(folder: Path) -> transformers.ProcessorMixin:
    """The folder's processor with the PIL image processor, the one the engine's
    preprocessing reproduces (engine/multimodal): where torchvision is installed,
    transformers 5 takes its torchvision image processor by default, which resizes
    otherwise (on a GPU machine it gave Qwen2.5-VL's tiny model other tokens)."""
    return transformers.AutoProcessor.from_pretrained(folder, use_fast=False)


def pil_image_processor(folder: Path) -> transformers.BaseImageProcessor:
    """The folder's PIL image processor (see pil_processor)."""
    return transformers.AutoImageProcessor.from_pretrained(folder, use_fast=False)


def qwen2_5_vl_processor(folder: Path) -> transformers.ProcessorMixin:
    """The folder's Qwen2_5_VLProcessor (its PIL image processor): AutoProcessor's where
    torchvision is installed, else the same for images alone."""
    if importlib.util.find_spec("torchvision") is not None:
        return pil_processor(folder)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    image_processor = pil_image_processor(folder)
    return ImageOnlyProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=tokenizer.chat_template,
    )


def save_tiny_qwen2_5_vl(folder: Path, seed: int = 0) -> Path:
    """Write a random-weight Qwen2_5_VLForConditionalGeneration (a windowed-attention
    vision transformer with its patch merger, and a Qwen2 text model with M-RoPE) with
    its tokenizer, image processor, processor and chat template into ``folder``."""
    torch.manual_seed(seed)
    tokenizer = make_byte_fallback_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": list(QWEN2_5_VL_SPECIAL_TOKENS)})
    tokenizer.chat_template = QWEN2_5_VL_CHAT_TEMPLATE
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in QWEN2_5_VL_SPECIAL_TOKENS}
    # head_dim 16, GQA ratio 2, 2 layers; generation stops on <|im_end|> too
    text_config = transformers.Qwen2_5_VLTextConfig(
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1_000_000.0,
            "mrope_section": list(QWEN2_5_VL_MROPE_SECTION),
        },
        **{
            **COMMON,
            "vocab_size": len(tokenizer),
            "eos_token_id": [COMMON["eos_token_id"], ids["<|im_end|>"]],
        },
    )
    # head_dim 8, a windowed layer then a full one
    vision_config = transformers.Qwen2_5_VLVisionConfig(
        depth=2,
        hidden_size=32,
        intermediate_size=48,
        num_heads=4,
        patch_size=QWEN2_5_VL_PATCH_SIZE,
        spatial_merge_size=QWEN2_5_VL_MERGE_SIZE,
        temporal_patch_size=2,
        window_size=16,
        out_hidden_size=64,
        fullatt_block_indexes=[1],
        initializer_range=0.5,
    )
    config = transformers.Qwen2_5_VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).to(torch.float32)
    with torch.no_grad():  # random biases and norms too, so a missing one would show
        for param_name, param in model.named_parameters():
            if param_name.endswith(".bias"):
                param.normal_(0, 0.5)
            elif "norm" in param_name or "ln_q" in param_name:
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder)
    # Saved as the Hub's Qwen2.5-VL folders keep their processor: preprocessor_config.json
    # (naming Qwen2_5_VLProcessor) and the tokenizer's files with the chat template.
    # (Qwen2_5_VLProcessor itself takes a video processor too, which needs torchvision.)
    factor = QWEN2_5_VL_PATCH_SIZE * QWEN2_5_VL_MERGE_SIZE
    image_processor = transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": 2 * factor * 2 * factor, "longest_edge": 64 * 64},
        patch_size=QWEN2_5_VL_PATCH_SIZE,
        temporal_patch_size=2,
        merge_size=QWEN2_5_VL_MERGE_SIZE,
    )
    image_processor.processor_class = "Qwen2_5_VLProcessor"
    image_processor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
