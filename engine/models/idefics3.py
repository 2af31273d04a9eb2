"""Idefics3 (SmolVLM): the decoder (decoder.py) running its Llama text model, with its
vision tower and connector (idefics3_vision.py) making the embeddings of each image's
placeholder tokens.

The checkpoint names the text model's tensors ``model.text_model.*``, which load as any
decoder's, and the vision side's ``model.vision_model.*`` and ``model.connector.*``.
"""

from __future__ import annotations

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.decoder import DecoderForCausalLM
from hetero_infer.engine.models.idefics3_vision import Idefics3Vision
from hetero_infer.engine.models.protocol import TensorParallel
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import Kernels, QuantizedWeight

TEXT_MODEL = "model.text_model."
VISION_PARTS = ("model.vision_model.", "model.connector.")


class Idefics3ForConditionalGeneration(DecoderForCausalLM):
    loaded_apart = ("vision.",)

    def __init__(
        self, config: ModelConfig, kernels: Kernels, tp: TensorParallel | None = None
    ) -> None:
        if config.vision is None:
            raise ConfigError(f"{config.architecture}: the config has no vision_config")
        super().__init__(config, kernels, tp)
        # Whole on every rank (rank 0 runs it and sends the embeddings).
        self.vision = Idefics3Vision.from_hf(config.vision.hf_config)

    def is_vision_weight(self, name: str) -> bool:
        return name.startswith(VISION_PARTS)

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """Images, each its tiles [tiles, 3, size, size] -> their placeholders'
        embeddings."""
        return self.vision.encode(torch.cat(pixel_values))

    def load_weights(self, state_dict: dict[str, torch.Tensor | QuantizedWeight]) -> None:
        vision, text = {}, {}
        for name, tensor in state_dict.items():
            if self.is_vision_weight(name):
                vision[name] = tensor
            else:
                text[name.replace(TEXT_MODEL, "model.", 1)] = tensor
        self.vision.load_weights(vision)
        super().load_weights(text)
