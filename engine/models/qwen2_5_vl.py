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

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.decoder import DecoderForCausalLM
from hetero_infer.engine.models.protocol import TensorParallel
from hetero_infer.engine.models.qwen2_5_vl_vision import Qwen2_5_VLVision, is_vision_name
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import Kernels, QuantizedWeight

TEXT_MODEL = "model.language_model."


def text_name(name: str) -> str:
    """A text model tensor's checkpoint name -> Qwen2's."""
    if name.startswith(TEXT_MODEL):
        return "model." + name.removeprefix(TEXT_MODEL)
    return name


class Qwen2_5_VLForConditionalGeneration(DecoderForCausalLM):
    loaded_apart = ("vision.",)

    def __init__(
        self, config: ModelConfig, kernels: Kernels, tp: TensorParallel | None = None
    ) -> None:
        if config.vision is None:
            raise ConfigError(f"{config.architecture}: the config has no vision_config")
        super().__init__(config, kernels, tp)
        # Whole on every rank (rank 0 runs it and sends the embeddings).
        self.vision = Qwen2_5_VLVision.from_hf(config.vision.hf_config)

    def is_vision_weight(self, name: str) -> bool:
        return is_vision_name(name)

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """Images, each its patches [grid_h, grid_w, patch values] -> their
        placeholders' embeddings, grid_h * grid_w / 4 per image, in order."""
        return self.vision.encode(pixel_values)

    def load_weights(self, state_dict: dict[str, torch.Tensor | QuantizedWeight]) -> None:
        vision, text = {}, {}
        for name, tensor in state_dict.items():
            if self.is_vision_weight(name):
                vision[name] = tensor
            else:
                text[text_name(name)] = tensor
        self.vision.load_weights(vision)
        super().load_weights(text)
