"""Idefics3 (SmolVLM): the decoder (decoder.py) running its Llama text model, with its
vision tower and connector (idefics3_vision.py) making the embeddings of each image's
placeholder tokens.

The checkpoint names the text model's tensors ``model.text_model.*``, which load as any
decoder's, and the vision side's ``model.vision_model.*`` and ``model.connector.*``.
"""

from __future__ import annotations

from typing import Any

import torch
from hetero_infer.engine.models.idefics3_vision import Idefics3Vision
from hetero_infer.engine.models.vision_language import VisionLanguageModel, joined
from torch import nn

TEXT_MODEL = "model.text_model."
VISION_PARTS = ("model.vision_model.", "model.connector.")


class Idefics3ForConditionalGeneration(VisionLanguageModel):
    def build_vision(self, hf_config: dict[str, Any]) -> nn.Module:
        return Idefics3Vision.from_hf(hf_config, self.kernels.ops)

    def is_vision_weight(self, name: str) -> bool:
        return name.startswith(VISION_PARTS)

    def text_name(self, name: str) -> str:
        return name.replace(TEXT_MODEL, "model.", 1)

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """Images, each its tiles [tiles, 3, size, size] -> their placeholders'
        embeddings."""
        return self.vision.encode(joined(pixel_values))
