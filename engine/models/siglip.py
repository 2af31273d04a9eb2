"""SigLIP's vision transformer, the image encoder of Idefics3 / SmolVLM: each patch of a
tile, embedded by a strided convolution, plus a learned position embedding, then
pre-norm layers of bidirectional attention (biases on every projection) and a GELU MLP,
and a final LayerNorm. Its projections, GELU and attention run on the kernels the text
model runs on (KernelOps: packed linears, vision_weights.py, the C++ GELU in bf16 and
fp16, and the C++ attention for fp32's small heads: kernels/encoder_attention.py); the
rest is torch's ops in the weights' dtype, with no KV cache (a tile's patches are
all there at once).

Module names follow the checkpoint's (``embeddings.patch_embedding``,
``encoder.layers.{i}.self_attn.q_proj`` ...), so its weights load by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from hetero_infer.engine.models.vision_weights import vision_linear
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import KernelOps
from torch import nn

# The MLP's activations by transformers' names, each as the kernels run it.
ACTIVATIONS: dict[str, Callable[[KernelOps], Callable[[torch.Tensor], torch.Tensor]]] = {
    "gelu_pytorch_tanh": lambda ops: ops.gelu_tanh,
    "gelu": lambda ops: F.gelu,
}


@dataclass(frozen=True)
class SiglipVisionConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    image_size: int  # a tile's side in pixels
    patch_size: int
    num_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"
    layer_norm_eps: float = 1e-6

    @classmethod
    def from_hf(cls, vision: Mapping[str, Any]) -> SiglipVisionConfig:
        """From a vision_config as transformers names it (every key present)."""
        return cls(
            hidden_size=vision["hidden_size"],
            intermediate_size=vision["intermediate_size"],
            num_layers=vision["num_hidden_layers"],
            num_heads=vision["num_attention_heads"],
            image_size=vision["image_size"],
            patch_size=vision["patch_size"],
            num_channels=vision["num_channels"],
            hidden_act=vision["hidden_act"],
            layer_norm_eps=vision["layer_norm_eps"],
        )

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError(
                f"vision hidden_size {self.hidden_size} is not a multiple of "
                f"num_attention_heads {self.num_heads}"
            )
        if self.image_size % self.patch_size:
            raise ConfigError(
                f"vision image_size {self.image_size} is not a multiple of "
                f"patch_size {self.patch_size}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"vision hidden_act {self.hidden_act!r} is not supported")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size


class SiglipVisionEmbeddings(nn.Module):
    def __init__(
        self, config: SiglipVisionConfig, position_ids: torch.Tensor, ops: KernelOps
    ) -> None:
        """``position_ids``: [patches] each patch's row in the position embedding; SigLIP's
        own are 0, 1, 2 ..., Idefics3's are fractional positions bucketed
        (idefics3_vision.py)."""
        super().__init__()
        self.patch_size = config.patch_size
        # The checkpoint's patch convolution, whose stride is its kernel, as what it is:
        # one projection of each patch's pixels (_load_from_state_dict flattens its
        # weight), on the kernels the other projections run on. The same sums as torch's
        # convolution in another order (1e-7 relative); oneDNN's convolution of the tiny
        # tower's 13 tiles took 0.2-0.27 ms where this takes 0.1.
        patch_pixels = config.num_channels * config.patch_size**2
        self.patch_projection = vision_linear(patch_pixels, config.hidden_size, ops)
        self.position_embedding = nn.Embedding(config.patches_per_side**2, config.hidden_size)
        # Not a weight: computed, not loaded. A plain attribute, not a buffer: the model
        # is built on the meta device, and to_empty would leave a buffer's values unset.
        self.position_ids = position_ids.to("cpu")

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for kind in ("weight", "bias"):
            name = f"{prefix}patch_embedding.{kind}"
            if name in state_dict:  # the weight [hidden, channels, patch, patch] flattened
                tensor = state_dict.pop(name)
                flat = tensor.flatten(1) if kind == "weight" else tensor
                state_dict[f"{prefix}patch_projection.{kind}"] = flat
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        tiles, channels, height, width = pixel_values.shape
        p = self.patch_size
        # Each patch's pixels as a row, channel by channel, then row by row within it
        # (the convolution weight's order), the patches row by row.
        patches = (
            pixel_values.reshape(tiles, channels, height // p, p, width // p, p)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(tiles * (height // p) * (width // p), channels * p * p)
        )
        # [tiles, side * side, hidden]
        embedded = self.patch_projection(patches).view(
            tiles, -1, self.position_embedding.embedding_dim
        )
        rows = self.position_ids.to(embedded.device)
        return embedded + self.position_embedding(rows)


class SiglipAttention(nn.Module):
    def __init__(self, config: SiglipVisionConfig, ops: KernelOps) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        # The checkpoint's q_proj, k_proj and v_proj as one product (_load_from_state_dict
        # joins them): each output's sum is the one its own projection makes, to the bit,
        # in two calls fewer a layer.
        self.qkv_proj = vision_linear(hidden, 3 * hidden, ops)
        self.out_proj = vision_linear(hidden, hidden, ops)
        self.attention = ops.encoder_attention

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        for kind in ("weight", "bias"):
            names = [f"{prefix}{part}_proj.{kind}" for part in "qkv"]
            if all(name in state_dict for name in names):
                state_dict[f"{prefix}qkv_proj.{kind}"] = torch.cat(
                    [state_dict.pop(name) for name in names]
                )
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tiles, patches, hidden = x.shape
        heads = (tiles, patches, self.num_heads, self.head_dim)
        # [tiles, heads, patches, head_dim] each
        q, k, v = (p.view(heads).transpose(1, 2) for p in self.qkv_proj(x).split(hidden, -1))
        # Every patch sees every patch of its tile: no mask, since every tile is a whole
        # image (Idefics3 masks only the padding of tiles smaller than the encoder's size,
        # which one image's tiles never are: idefics3_images.py).
        out = self.attention(q, k, v, self.head_dim**-0.5)  # [tiles, patches, heads, dim]
        return self.out_proj(out.reshape(tiles, patches, hidden))


class SiglipMLP(nn.Module):
    def __init__(self, config: SiglipVisionConfig, ops: KernelOps) -> None:
        super().__init__()
        self.fc1 = vision_linear(config.hidden_size, config.intermediate_size, ops)
        self.fc2 = vision_linear(config.intermediate_size, config.hidden_size, ops)
        self.act = ACTIVATIONS[config.hidden_act](ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SiglipEncoderLayer(nn.Module):
    def __init__(self, config: SiglipVisionConfig, ops: KernelOps) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.self_attn = SiglipAttention(config, ops)
        self.layer_norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = SiglipMLP(config, ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp(self.layer_norm2(x))


class SiglipEncoder(nn.Module):
    def __init__(self, config: SiglipVisionConfig, ops: KernelOps) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            SiglipEncoderLayer(config, ops) for _ in range(config.num_layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class SiglipVisionTransformer(nn.Module):
    def __init__(
        self,
        config: SiglipVisionConfig,
        ops: KernelOps,
        position_ids: torch.Tensor | None = None,
    ) -> None:
        """``ops``: the kernels its projections run on; ``position_ids``: as
        SiglipVisionEmbeddings takes them, None for SigLIP's own."""
        super().__init__()
        self.config = config
        if position_ids is None:
            position_ids = torch.arange(config.patches_per_side**2, device="cpu")
        self.embeddings = SiglipVisionEmbeddings(config, position_ids, ops)
        self.encoder = SiglipEncoder(config, ops)
        self.post_layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """[tiles, channels, image_size, image_size] -> [tiles, patches, hidden], the
        patches row by row."""
        size = self.config.image_size
        if pixel_values.dim() != 4 or pixel_values.shape[1:] != (
            self.config.num_channels,
            size,
            size,
        ):
            raise ValueError(
                f"pixel values of shape {tuple(pixel_values.shape)}; the vision encoder "
                f"takes [tiles, {self.config.num_channels}, {size}, {size}]"
            )
        x = self.embeddings(pixel_values)
        return self.post_layernorm(self.encoder(x))
