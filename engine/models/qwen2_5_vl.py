"""Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): the decoder (decoder.py) running its
Qwen2 text model as Qwen2ForCausalLM's (q/k/v biases, no sliding window), with its vision
transformer and patch merger (qwen2_5_vl_vision.py) making the embeddings of each
image's ``<|image_pad|>`` tokens, one per 2 x 2 patches of the image at its own size.

Its text model rotates q and k by M-RoPE: each token has a (temporal, row, column)
position, and the head's frequencies are split among the three (ModelConfig's
mrope_section); a text token's three are equal, so it is plain RoPE on text. The
positions themselves are the engine's (an image's tokens at (start, start + row,
start + column), the text after it going on from start + max(rows, columns)).

Its checkpoints name the text model's tensors in two ways, both loaded as Qwen2's
``model.*`` and ``lm_head.weight``: the Hub's files and transformers 5's save_pretrained
``model.*`` (as Qwen2's own), a model's own state dict (transformers 5 in memory, as
4.5x saved) ``model.language_model.*``. The vision side's names: qwen2_5_vl_vision.py.
"""

from __future__ import annotations

from typing import Any

from hetero_infer.engine.models.qwen2_5_vl_vision import Qwen2_5_VLVision, is_vision_name
from hetero_infer.engine.models.vision_language import VisionLanguageModel
from torch import nn

TEXT_MODEL = "model.language_model."


class Qwen2_5_VLForConditionalGeneration(VisionLanguageModel):
    """Its images, each its patches [grid_h, grid_w, patch values], make grid_h * grid_w
    / 4 embeddings each, in order."""

    def build_vision(self, hf_config: dict[str, Any]) -> nn.Module:
        return Qwen2_5_VLVision.from_hf(hf_config, self.kernels.ops)

    def is_vision_weight(self, name: str) -> bool:
        return is_vision_name(name)

    def text_name(self, name: str) -> str:
        if name.startswith(TEXT_MODEL):
            return "model." + name.removeprefix(TEXT_MODEL)
        return name
