"""Gemma 3 with images (Gemma3ForConditionalGeneration, Gemma 3 4B and larger): the
decoder (decoder.py) running its Gemma 3 text model as Gemma3ForCausalLM's, with its
vision tower and projector (gemma3_vision.py) making the embeddings of each image's
placeholder tokens.

Its checkpoints name the text model's tensors in three ways, all loaded as the text
Gemma 3's ``model.*`` and ``lm_head.weight``: the Hub's Gemma 3 files and transformers
5's save_pretrained ``language_model.model.*`` (and ``language_model.lm_head.weight``
where untied), a model's own state dict (transformers 4.5x's files)
``model.language_model.*`` and ``lm_head.weight``. The vision side's names:
gemma3_vision.py.
"""

from __future__ import annotations

from typing import Any

import torch
from hetero_infer.engine.models.gemma3_vision import Gemma3Vision, is_vision_name
from hetero_infer.engine.models.vision_language import VisionLanguageModel, joined
from torch import nn

# The text model's prefixes -> the decoder's, first match wins.
TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
)


class Gemma3ForConditionalGeneration(VisionLanguageModel):
    def build_vision(self, hf_config: dict[str, Any]) -> nn.Module:
        return Gemma3Vision.from_hf(hf_config, self.kernels.ops)

    def is_vision_weight(self, name: str) -> bool:
        return is_vision_name(name)

    def text_name(self, name: str) -> str:
        for prefix, ours in TEXT_PREFIXES:
            if name.startswith(prefix):
                return ours + name.removeprefix(prefix)
        return name

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """Images, each [1, 3, size, size] -> their placeholders' embeddings."""
        return self.vision.encode(joined(pixel_values))
