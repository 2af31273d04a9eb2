"""The vision half of Gemma 3 (transformers' Gemma3ForConditionalGeneration): the SigLIP
tower (siglip.py, with SigLIP's own position ids) and Gemma3MultiModalProjector, which
turns the tower's patch embeddings into the text model's: the patch grid average-pooled
into mm_tokens_per_image tokens (4 x 4 patches each at Gemma 3's 64 x 64 patches and 256
tokens), a Gemma RMSNorm (x * (1 + w), in float32 as transformers' Gemma3RMSNorm), and a
matrix without bias to the text model's hidden size. Each image becomes
mm_tokens_per_image embeddings, which take the places of its ``<image_soft_token>``
tokens in the prompt, in order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from hetero_infer.engine.models.siglip import SiglipVisionConfig, SiglipVisionTransformer
from hetero_infer.engine.models.vision_weights import load_vision_weights
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import KernelOps
from torch import nn

# The checkpoint's names for the tower (stripped, its weights are SiglipVisionTransformer's
# own) and the projector, first match wins: transformers 5's save_pretrained writes the
# tower without its ``vision_model.`` (``vision_tower.embeddings...``), the Hub's Gemma 3
# files with it, and a model's own state dict (as transformers 4.5x saved) under ``model.``.
TOWER_PREFIXES = (
    "model.vision_tower.vision_model.",
    "vision_tower.vision_model.",
    "model.vision_tower.",
    "vision_tower.",
)
PROJECTOR_PREFIXES = ("model.multi_modal_projector.", "multi_modal_projector.")
# The tower's attention-pooling head, where a SiglipVisionConfig keeps vision_use_head:
# Gemma 3 reads the tower's last hidden state, never the head's output.
UNUSED_TOWER_PARTS = ("head.",)

# transformers' SiglipVisionConfig defaults, for the keys a config.json leaves out
# (transformers saves only what differs from them).
VISION_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "hidden_act": "gelu_pytorch_tanh",
    "layer_norm_eps": 1e-6,
}
DEFAULT_TOKENS_PER_IMAGE = 256  # Gemma3Config's mm_tokens_per_image
DEFAULT_TEXT_HIDDEN_SIZE = 2304  # Gemma3TextConfig's


class GemmaRMSNorm(nn.Module):
    """transformers' Gemma3RMSNorm: in float32, x / rms(x) * (1 + weight), then back to
    the input's dtype. The checkpoint stores the weight as (weight - 1)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * (1.0 + self.weight.float())).type_as(x)


class Gemma3Projector(nn.Module):
    """Gemma3MultiModalProjector, its parameters under the checkpoint's names."""

    def __init__(
        self, vision: SiglipVisionConfig, tokens_per_image: int, text_hidden_size: int
    ) -> None:
        super().__init__()
        tokens_per_side = int(tokens_per_image**0.5)
        side = vision.patches_per_side
        if tokens_per_side**2 != tokens_per_image or side % tokens_per_side:
            raise ConfigError(
                f"Gemma 3: mm_tokens_per_image {tokens_per_image} is not a square that "
                f"pools {side} x {side} patches evenly"
            )
        self.patches_per_side = side
        self.kernel_size = side // tokens_per_side
        self.mm_input_projection_weight = nn.Parameter(
            torch.zeros(vision.hidden_size, text_hidden_size)
        )
        self.mm_soft_emb_norm = GemmaRMSNorm(vision.hidden_size, eps=vision.layer_norm_eps)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """[images, patches, vision hidden] -> [images, tokens_per_image, text hidden]."""
        images, _, hidden = patches.shape
        side = self.patches_per_side
        grid = patches.transpose(1, 2).reshape(images, hidden, side, side)
        pooled = F.avg_pool2d(grid, kernel_size=self.kernel_size, stride=self.kernel_size)
        pooled = pooled.flatten(2).transpose(1, 2)  # [images, tokens, vision hidden]
        normed = self.mm_soft_emb_norm(pooled)
        return torch.matmul(normed, self.mm_input_projection_weight).type_as(patches)


class Gemma3Vision(nn.Module):
    def __init__(
        self,
        vision: SiglipVisionConfig,
        tokens_per_image: int,
        text_hidden_size: int,
        ops: KernelOps,
    ) -> None:
        """``ops``: the kernels the tower's projections run on."""
        super().__init__()
        self.mm_tokens_per_image = tokens_per_image
        self.vision_model = SiglipVisionTransformer(vision, ops)  # SigLIP's own position ids
        self.multi_modal_projector = Gemma3Projector(vision, tokens_per_image, text_hidden_size)

    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | Any, ops: KernelOps | None = None) -> Gemma3Vision:
        """From the model's config.json as a dict (or a transformers Gemma3Config): its
        vision_config, mm_tokens_per_image and text_config's hidden_size; the tower's
        projections on ``ops``' kernels (None: torch's)."""
        if not isinstance(config, Mapping):
            config = config.to_dict()
        vision = {**VISION_DEFAULTS, **(config.get("vision_config") or {})}
        text = config.get("text_config") or {}
        return cls(
            SiglipVisionConfig.from_hf(vision),
            tokens_per_image=config.get("mm_tokens_per_image") or DEFAULT_TOKENS_PER_IMAGE,
            text_hidden_size=text.get("hidden_size", DEFAULT_TEXT_HIDDEN_SIZE),
            ops=ops or KernelOps(),
        )

    @torch.inference_mode()
    def encode(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[images, 3, S, S] -> [images * mm_tokens_per_image, text hidden] in the
        weights' dtype: the embeddings for the images' ``<image_soft_token>`` tokens,
        image after image."""
        weight = self.multi_modal_projector.mm_input_projection_weight
        pixel_values = pixel_values.to(device=weight.device, dtype=weight.dtype)
        patches = self.vision_model(pixel_values)  # [images, patches, vision hidden]
        return self.multi_modal_projector(patches).flatten(0, 1)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """From the whole checkpoint's tensors, by their Hugging Face names (any of
        TOWER_PREFIXES and PROJECTOR_PREFIXES; the text model's are left alone), taken
        themselves (their dtype and device), as vision_weights.py has it."""
        weights = {}
        for name, tensor in state_dict.items():
            ours = vision_name(name)
            if ours is not None:
                weights[ours] = tensor
        load_vision_weights(self, weights, "Gemma 3")


def is_vision_name(name: str) -> bool:
    """Whether a checkpoint tensor is the vision side's (the tower's or the projector's)."""
    return name.startswith(TOWER_PREFIXES + PROJECTOR_PREFIXES)


def vision_name(name: str) -> str | None:
    """A checkpoint tensor's name in Gemma3Vision, or None: not the vision side's, or the
    tower's unused pooling head."""
    for prefix in TOWER_PREFIXES:
        if name.startswith(prefix):
            rest = name.removeprefix(prefix)
            return None if rest.startswith(UNUSED_TOWER_PARTS) else "vision_model." + rest
    for prefix in PROJECTOR_PREFIXES:
        if name.startswith(prefix):
            return "multi_modal_projector." + name.removeprefix(prefix)
    return None
