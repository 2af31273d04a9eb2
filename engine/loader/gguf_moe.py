"""A mixture-of-experts GGUF file's Hugging Face config, from llama.cpp's metadata.

transformers converts no OLMoE file, reads a Mixtral file (llama.cpp's architecture
"llama" with experts) as a dense Llama, and leaves Qwen-MoE's expert widths at its
defaults; so for these four the engine writes the config itself. The routing follows
llama.cpp's graphs: Mixtral and Qwen3-MoE renormalize the top-k weights, Qwen2-MoE and
OLMoE do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import transformers
from hetero_infer.engine.loader.gguf_header import read_gguf_header

# llama.cpp's architecture -> transformers' config class, and whether its top-k weights
# are renormalized. By name: transformers imports a config class's module when it is
# first named (~0.1 s each), which every server process's start would pay.
MOE_CONFIGS: dict[str, tuple[str, bool]] = {
    "olmoe": ("OlmoeConfig", False),
    "qwen2moe": ("Qwen2MoeConfig", False),
    "qwen3moe": ("Qwen3MoeConfig", True),
    "llama": ("MixtralConfig", True),
}


def moe_gguf_config(path: Path) -> transformers.PretrainedConfig | None:
    """The HF config of a mixture-of-experts GGUF file, or None for another file."""
    header = read_gguf_header(path)
    arch = header.fields.get("general.architecture")
    experts = header.fields.get(f"{arch}.expert_count")
    if arch not in MOE_CONFIGS or not experts:
        return None
    class_name, renormalize = MOE_CONFIGS[arch]
    config_class = getattr(transformers, class_name)

    def get(key: str, default: Any = None) -> Any:
        return header.fields.get(f"{arch}.{key}", default)

    heads = get("attention.head_count")
    hidden = get("embedding_length")
    tokens = header.fields.get("tokenizer.ggml.tokens") or []
    names = {tensor.name for tensor in header.tensors}
    settings: dict[str, Any] = dict(
        vocab_size=len(tokens) or get("vocab_size"),
        hidden_size=hidden,
        num_hidden_layers=get("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=get("attention.head_count_kv", heads),
        max_position_embeddings=get("context_length"),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        rope_parameters={"rope_type": "default", "rope_theta": float(get("rope.freq_base", 1e4))},
        num_experts_per_tok=get("expert_used_count"),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=header.fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=header.fields.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=header.fields.get("tokenizer.ggml.padding_token_id"),
    )
    expert_width = get("expert_feed_forward_length") or get("feed_forward_length")
    if arch == "llama":  # Mixtral
        settings |= dict(
            num_local_experts=experts,
            intermediate_size=expert_width,
            head_dim=get("attention.key_length", hidden // heads),
        )
    elif arch == "olmoe":
        settings |= dict(num_experts=experts, intermediate_size=expert_width)
    else:  # the Qwen MoEs: a layer without a router keeps its dense MLP
        layers = range(settings["num_hidden_layers"])
        settings |= dict(
            num_experts=experts,
            intermediate_size=get("feed_forward_length") or expert_width,
            moe_intermediate_size=expert_width,
            mlp_only_layers=[i for i in layers if f"blk.{i}.ffn_gate_inp.weight" not in names],
        )
        if arch == "qwen3moe":
            settings["head_dim"] = get("attention.key_length", hidden // heads)
        else:
            settings["shared_expert_intermediate_size"] = get(
                "expert_shared_feed_forward_length", 0
            )
    if arch != "llama":
        settings["norm_topk_prob"] = renormalize
    config = config_class(**settings)
    config.architectures = [config_class.__name__.replace("Config", "ForCausalLM")]
    return config
