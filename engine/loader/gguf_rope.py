"""The RoPE settings a GGUF file keeps outside what transformers' conversion of its
metadata reads: a Phi-3 file's rotated dims (Phi-4-mini rotates 96 of 128) and its
LongRoPE factors, which llama.cpp's converter stores as two small tensors beside the
weights (rope_factors_short and rope_factors_long) with the original context length.
Without them a converted config would rotate whole heads with plain RoPE: wrong keys
for every position, and no error to say so."""

from __future__ import annotations

import transformers
from hetero_infer.engine.loader.gguf_header import GGUFHeader


def phi3_rope_from_gguf(header: GGUFHeader, config: transformers.PretrainedConfig) -> None:
    """Set ``config``'s partial rotary factor and LongRoPE parameters from a Phi-3 GGUF
    file's metadata and factor tensors, where it has them."""
    field = header.fields.get
    head_dim = config.hidden_size // config.num_attention_heads
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rotary_dim = field("phi3.rope.dimension_count") or head_dim
    if rotary_dim != head_dim:
        rope["partial_rotary_factor"] = rotary_dim / head_dim
    factors = {
        t.name: [float(x) for x in t.data] for t in header.tensors if "rope_factors" in t.name
    }
    if factors:
        rope |= {
            "rope_type": "longrope",
            "short_factor": factors["rope_factors_short.weight"],
            "long_factor": factors["rope_factors_long.weight"],
        }
        original = field("phi3.rope.scaling.original_context_length")
        config.original_max_position_embeddings = original
    config.rope_parameters = rope
