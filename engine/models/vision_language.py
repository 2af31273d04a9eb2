"""VisionLanguageModel: what every vision-language model here is, whatever its family:
the one decoder (decoder.py) running its text model, beside its vision side (its own
module, built from the config's vision parts) that makes the embeddings of each
image's placeholder tokens. A family names its vision side, which of the checkpoint's
tensors are that side's, and how its text model's tensors are named in the decoder's
terms.

The vision side is whole on every tensor-parallel rank (engine/models/sharding.py keeps
its tensors whole): rank 0 runs it and sends the embeddings with the step.
"""

from __future__ import annotations

import abc
from typing import Any

import torch
from hetero_infer.engine.models.config import ModelConfig
from hetero_infer.engine.models.decoder import DecoderForCausalLM
from hetero_infer.engine.models.protocol import TensorParallel
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import Kernels, QuantizedWeight
from torch import nn


def joined(parts: list[torch.Tensor]) -> torch.Tensor:
    """Tensors one after another along their first dim (images' tiles for one encoder
    batch, a step's image embedding rows): a single one as it is (torch.cat copies even
    one tensor, 0.1 ms for SmolVLM's 13 tiles)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts)


class VisionLanguageModel(DecoderForCausalLM, abc.ABC):
    # The vision side loads and packs its weights on its own (vision_weights.py).
    loaded_apart = ("vision.",)

    def __init__(
        self, config: ModelConfig, kernels: Kernels, tp: TensorParallel | None = None
    ) -> None:
        if config.vision is None:
            raise ConfigError(f"{config.architecture}: the config has no vision_config")
        super().__init__(config, kernels, tp)
        self.vision = self.build_vision(config.vision.hf_config)

    @abc.abstractmethod
    def build_vision(self, hf_config: dict[str, Any]) -> nn.Module:
        """The family's vision side, from the config's vision parts (not loaded yet)."""

    def text_name(self, name: str) -> str:
        """A text model tensor's checkpoint name -> the decoder's (``model.*``)."""
        return name

    def encode_images(self, pixel_values: list[torch.Tensor]) -> torch.Tensor:
        """Images, each as its processor made it -> their placeholders' embeddings."""
        return self.vision.encode(pixel_values)

    def load_weights(self, state_dict: dict[str, torch.Tensor | QuantizedWeight]) -> None:
        vision, text = {}, {}
        for name, tensor in state_dict.items():
            if self.is_vision_weight(name):
                vision[name] = tensor
            else:
                text[self.text_name(name)] = tensor
        # To where the model's parameters were made (its device): the vision side
        # assigns the tensors it is given, and the loader's are on the CPU.
        device = next(self.vision.parameters()).device
        self.vision.load_weights(
            {n: t.to(device) if isinstance(t, torch.Tensor) else t for n, t in vision.items()}
        )
        super().load_weights(text)
