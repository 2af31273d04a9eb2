"""The vision half of Idefics3 / SmolVLM (transformers' Idefics3ForConditionalGeneration):
the SigLIP tower (siglip.py) and the connector that turns its patch embeddings into the
text model's: a pixel shuffle that folds each scale_factor x scale_factor block of
patches into one vector (fewer tokens, each wider), then a linear projection without
bias to the text model's hidden size. Each tile becomes image_seq_len embeddings, which
take the places of its ``<image>`` tokens in the prompt, in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from hetero_infer.engine.models.siglip import SiglipVisionConfig, SiglipVisionTransformer
from hetero_infer.engine.models.vision_weights import load_vision_weights, vision_linear
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import KernelOps
from torch import nn

# The checkpoint's names: the tower's weights under VISION_PREFIX (stripped, they are
# SiglipVisionTransformer's own), the connector's one matrix at PROJECTION_WEIGHT.
VISION_PREFIX = "model.vision_model."
PROJECTION_WEIGHT = "model.connector.modality_projection.proj.weight"

# transformers' Idefics3VisionConfig defaults, for the keys a config.json leaves out
# (transformers saves only what differs from them).
VISION_DEFAULTS = {
    "hidden_size": 1152,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 32,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
DEFAULT_SCALE_FACTOR = 2
DEFAULT_TEXT_HIDDEN_SIZE = 4096  # Llama's, Idefics3Config's default text model


def fractional_position_ids(patches_per_side: int) -> torch.Tensor:
    """[patches_per_side ** 2] the position embedding rows of a whole tile's patches.

    Idefics3 (after NaViT) places a patch by its fractional position in the tile, i/n,
    bucketed into n equal intervals, so that a smaller image would spread its patches over
    the whole grid of embeddings. For a whole tile that should be row i, but float32
    rounding drops some i/n just under their interval's start: for n = 19, 25, 29 ... a
    few patches take their neighbour's row, and the model was trained so. Computed as
    transformers does, in float32 on the CPU.
    """
    n = patches_per_side
    boundaries = torch.arange(1 / n, 1.0, 1 / n, dtype=torch.float32, device="cpu")
    step = 1.0 / torch.tensor(n, device="cpu")  # float32, as 1 / a patch count tensor
    fractions = torch.arange(n, dtype=torch.float32, device="cpu") * step
    buckets = torch.bucketize(fractions.clamp(max=1.0 - 1e-6), boundaries, right=True)
    return (buckets[:, None] * n + buckets[None, :]).flatten()


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[tiles, side * side, dim] -> [tiles, (side / scale) ** 2, scale * scale * dim]: each
    scale x scale block of patches, its rows in order and each row's patches in order,
    concatenated into one vector; the blocks row by row."""
    tiles, patches, dim = x.shape
    side = int(patches**0.5)
    blocks = side // scale
    x = x.view(tiles, blocks, scale, blocks, scale, dim)
    x = x.permute(0, 1, 3, 2, 4, 5)  # [tiles, block row, block col, row, col, dim]
    return x.reshape(tiles, blocks * blocks, scale * scale * dim)


class Idefics3Vision(nn.Module):
    def __init__(
        self,
        vision: SiglipVisionConfig,
        scale_factor: int,
        text_hidden_size: int,
        ops: KernelOps,
    ) -> None:
        """``ops``: the kernels its projections run on."""
        super().__init__()
        if vision.patches_per_side % scale_factor:
            raise ConfigError(
                f"Idefics3: {vision.patches_per_side} patches a side do not split into "
                f"blocks of scale_factor {scale_factor}"
            )
        self.scale_factor = scale_factor
        self.image_seq_len = (vision.patches_per_side // scale_factor) ** 2
        position_ids = fractional_position_ids(vision.patches_per_side)
        self.vision_model = SiglipVisionTransformer(vision, ops, position_ids)
        self.projection = vision_linear(
            vision.hidden_size * scale_factor**2, text_hidden_size, ops, bias=False
        )

    @classmethod
    def from_hf(
        cls, config: Mapping[str, Any] | Any, ops: KernelOps | None = None
    ) -> Idefics3Vision:
        """From the model's config.json as a dict (or a transformers Idefics3Config):
        its vision_config, scale_factor and text_config's hidden_size; its projections
        on ``ops``' kernels (None: torch's)."""
        if not isinstance(config, Mapping):
            config = config.to_dict()
        vision = {**VISION_DEFAULTS, **(config.get("vision_config") or {})}
        text = config.get("text_config") or {}
        return cls(
            SiglipVisionConfig.from_hf(vision),
            scale_factor=config.get("scale_factor", DEFAULT_SCALE_FACTOR),
            text_hidden_size=text.get("hidden_size", DEFAULT_TEXT_HIDDEN_SIZE),
            ops=ops or KernelOps(),
        )

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[tiles, 3, S, S] (ProcessedImage.pixel_values) -> [tiles * image_seq_len,
        text hidden] in the weights' dtype: the embeddings for the image's ``<image>``
        tokens, tile after tile."""
        weight = self.projection.weight
        pixel_values = pixel_values.to(device=weight.device, dtype=weight.dtype)
        patches = self.vision_model(pixel_values)  # [tiles, patches, vision hidden]
        blocks = pixel_shuffle(patches, self.scale_factor)  # [tiles, image_seq_len, ...]
        return self.projection(blocks).flatten(0, 1)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """From the whole checkpoint's tensors, by their Hugging Face names: those under
        VISION_PREFIX and PROJECTION_WEIGHT (the text model's are left alone), taken
        themselves (their dtype and device), as vision_weights.py has it."""
        weights = {
            "vision_model." + name.removeprefix(VISION_PREFIX): tensor
            for name, tensor in state_dict.items()
            if name.startswith(VISION_PREFIX)
        }
        if PROJECTION_WEIGHT in state_dict:
            weights["projection.weight"] = state_dict[PROJECTION_WEIGHT]
        load_vision_weights(self, weights, "Idefics3")
