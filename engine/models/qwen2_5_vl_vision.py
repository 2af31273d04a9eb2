"""The vision half of Qwen2.5-VL (transformers' Qwen2_5_VisionTransformerPretrainedModel):
a ViT over an image's own grid of patches, at the image's own size, whose output is one
embedding per 2 x 2 patches (spatial_merge_size) for the image's ``<|image_pad|>`` tokens.

As transformers computes it (the projections and RMSNorms on the text model's kernels):
the patch embedding (a Conv3d whose stride is its kernel: one matrix over each patch's
pixels, kept a Conv3d for transformers' sums), a 2D rotary embedding (a row and a column
angle per patch, over half of each head's dims each), RMSNorm blocks with a SwiGLU MLP
with biases, and the patch merger (RMSNorm ``ln_q``, the 2 x 2 patches
concatenated, a GELU MLP). Most blocks attend within windows of window_size pixels (whole
merged patches, row by row of windows), the fullatt_block_indexes ones across the whole
image; the tokens run in window order through the blocks (transformers'
get_window_index), and the merged embeddings come back in the processor's order.

Each image's pixel values come as [grid_h, grid_w, channels * temporal_patch_size *
patch_size**2]: the processor's flattened patches in its own order (merge block by
merge block), reshaped only so that the grid travels with them; an image has grid_t 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from hetero_infer.engine.models.exact_convolution import fp32_convolutions
from hetero_infer.engine.models.vision_weights import load_vision_weights, vision_linear
from hetero_infer.engine.settings.exceptions import ConfigError
from hetero_infer.kernels import KernelOps
from torch import nn

# The checkpoint's prefixes of the vision tower: the Hub's files and transformers 5's
# save_pretrained ``visual.``; a model's own state dict (transformers 5 in memory, as
# transformers 4.5x saved) ``model.visual.``.
VISION_PREFIXES = ("model.visual.", "visual.")

# transformers' Qwen2_5_VLVisionConfig defaults, for the keys a config.json leaves out.
VISION_DEFAULTS = {
    "depth": 32,
    "hidden_size": 3584,
    "hidden_act": "silu",
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "out_hidden_size": 3584,
    "fullatt_block_indexes": (7, 15, 23, 31),
}
DEFAULT_ROPE_THETA = 10000.0  # the vision config's axial RoPE
RMS_NORM_EPS = 1e-6  # fixed in transformers' vision blocks and merger


class RMSNorm(nn.Module):
    """Qwen2_5_VLRMSNorm, by the kernels' rms_norm: its reference is the same formula."""

    def __init__(self, dim: int, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.rms_norm = ops.rms_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(x, self.weight, RMS_NORM_EPS)


class Attention(nn.Module):
    def __init__(self, dim: int, num_heads: int, ops: KernelOps) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = vision_linear(dim, 3 * dim, ops)
        self.proj = vision_linear(dim, dim, ops)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        """x [tokens, dim]; each of ``lengths`` consecutive tokens attend to each other."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = torch.empty_like(q)
        # Segments of one length batched: windows are mostly of the same size.
        starts: dict[int, list[int]] = {}
        offset = 0
        for length in lengths:
            starts.setdefault(length, []).append(offset)
            offset += length
        for length, firsts in starts.items():
            index = torch.tensor(firsts, device=x.device)[:, None] + torch.arange(
                length, device=x.device
            )
            qb, kb, vb = (t[index].transpose(1, 2) for t in (q, k, v))  # [B, heads, L, d]
            out[index] = F.scaled_dot_product_attention(qb, kb, vb).transpose(1, 2)
        return self.proj(out.reshape(n, -1))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """apply_rotary_pos_emb_vision: x [tokens, heads, d], cos/sin [tokens, d], in float32."""
    h = x.float()
    half = h.shape[-1] // 2
    rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
    return (h * cos[:, None] + rotated * sin[:, None]).to(x.dtype)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str, ops: KernelOps) -> None:
        super().__init__()
        self.gate_proj = vision_linear(dim, hidden, ops)
        self.up_proj = vision_linear(dim, hidden, ops)
        self.down_proj = vision_linear(hidden, dim, ops)
        self.act = {"silu": F.silu, "gelu": F.gelu, "quick_gelu": quick_gelu}[act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


class Block(nn.Module):
    def __init__(
        self, dim: int, num_heads: int, intermediate: int, act: str, ops: KernelOps
    ) -> None:
        super().__init__()
        self.norm1 = RMSNorm(dim, ops)
        self.norm2 = RMSNorm(dim, ops)
        self.attn = Attention(dim, num_heads, ops)
        self.mlp = MLP(dim, intermediate, act, ops)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, lengths)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    def __init__(self, channels: int, temporal: int, patch: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Module()
        self.proj.weight = nn.Parameter(torch.empty(dim, channels, temporal, patch, patch))

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """[patches, channels * temporal * patch**2] -> [patches, dim]. As transformers'
        Conv3d: the same sums as one matrix product, but not in the same order, which the
        tiny model's large weights make a difference of 1e-3 relative downstream."""
        weight = self.proj.weight
        patches = pixels.view(-1, *weight.shape[1:])
        with fp32_convolutions():
            embedded = F.conv3d(patches, weight, stride=weight.shape[2:])
        return embedded.view(-1, weight.shape[0])


class PatchMerger(nn.Module):
    def __init__(self, dim: int, out_dim: int, merge_size: int, ops: KernelOps) -> None:
        super().__init__()
        self.hidden = hidden = dim * merge_size**2
        self.ln_q = RMSNorm(dim, ops)
        first, second = vision_linear(hidden, hidden, ops), vision_linear(hidden, out_dim, ops)
        self.mlp = nn.Sequential(first, nn.GELU(), second)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_q(x).view(-1, self.hidden))


class Qwen2_5_VLVision(nn.Module):
    def __init__(self, vision: Mapping[str, Any], ops: KernelOps) -> None:
        """``vision``: every key of VISION_DEFAULTS; ``ops``: its projections' kernels."""
        super().__init__()
        dim, heads = vision["hidden_size"], vision["num_heads"]
        if dim % heads or (dim // heads) % 4:
            raise ConfigError(f"Qwen2.5-VL vision: {heads} heads of {dim} dims, not 4k each")
        self.patch_size = vision["patch_size"]
        self.merge_size = vision["spatial_merge_size"]
        self.fullatt_blocks = frozenset(vision["fullatt_block_indexes"])
        # Merged patches per window side (transformers' vit_merger_window_size).
        self.window = vision["window_size"] // self.merge_size // self.patch_size
        if self.window < 1:
            raise ConfigError(f"Qwen2.5-VL vision: window_size {vision['window_size']} too small")
        self.patch_embed = PatchEmbed(
            vision["in_channels"], vision["temporal_patch_size"], self.patch_size, dim
        )
        self.blocks = nn.ModuleList(
            Block(dim, heads, vision["intermediate_size"], vision["hidden_act"], ops)
            for _ in range(vision["depth"])
        )
        self.merger = PatchMerger(dim, vision["out_hidden_size"], self.merge_size, ops)
        # RoPE's frequencies, made at each call: a buffer would not survive to_empty (the
        # engine builds the model on the meta device) nor a cast to bf16.
        self.rope_dim = dim // heads // 2  # each axis's share of a head's dims
        self.rope_theta = float(vision["rope_theta"])

    @classmethod
    def from_hf(
        cls, config: Mapping[str, Any] | Any, ops: KernelOps | None = None
    ) -> Qwen2_5_VLVision:
        """From the model's config.json as a dict (or a transformers Qwen2_5_VLConfig): its
        vision_config, with transformers' defaults for what it leaves out; its projections
        on ``ops``' kernels (None: torch's)."""
        if not isinstance(config, Mapping):
            config = config.to_dict()
        given = dict(config.get("vision_config") or {})
        aliases = {"num_attention_heads": "num_heads", "num_hidden_layers": "depth"}
        aliases["in_chans"] = "in_channels"  # the Hub's first Qwen2.5-VL configs
        for alias, name in aliases.items():
            if alias in given:
                given.setdefault(name, given[alias])
        vision = {**VISION_DEFAULTS, **given}
        rope = vision.get("rope_parameters") or {}
        vision["rope_theta"] = rope.get("rope_theta", vision.get("rope_theta", DEFAULT_ROPE_THETA))
        return cls(vision, ops or KernelOps())

    def window_order(self, grid_h: int, grid_w: int) -> tuple[torch.Tensor, list[int]]:
        """One image's merged patches in window order (row-major windows of self.window x
        self.window merged patches, each row-major) and each window's patch count."""
        h, w, size = grid_h // self.merge_size, grid_w // self.merge_size, self.window
        rows, cols = -(-h // size), -(-w // size)
        index = F.pad(
            torch.arange(h * w).view(h, w), (0, cols * size - w, 0, rows * size - h), value=-1
        )
        index = index.view(rows, size, cols, size).permute(0, 2, 1, 3).reshape(rows * cols, -1)
        counts = (index >= 0).sum(1)  # none is 0: ceil(h / size) x ceil(w / size) windows
        unit = self.merge_size**2
        return index[index >= 0], [int(c) * unit for c in counts]

    def positions(self, grid_h: int, grid_w: int) -> torch.Tensor:
        """[grid_h * grid_w, 2]: each patch's (row, column), in the processor's order."""
        m = self.merge_size
        rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
        shape = (grid_h // m, m, grid_w // m, m)
        return torch.stack(
            [
                rows.reshape(shape).transpose(1, 2).flatten(),
                cols.reshape(shape).transpose(1, 2).flatten(),
            ],
            dim=-1,
        )

    @torch.inference_mode()
    def encode(self, images: list[torch.Tensor]) -> torch.Tensor:
        """Images, each [grid_h, grid_w, patch values] -> [sum of grid_h * grid_w /
        merge_size**2, out_hidden_size] in the weights' dtype, image after image."""
        weight = self.patch_embed.proj.weight
        unit = self.merge_size**2
        pixels, positions, order, windows, whole = [], [], [], [], []
        merged = 0
        for image in images:
            grid_h, grid_w, _ = image.shape
            if grid_h % self.merge_size or grid_w % self.merge_size:
                raise ValueError(
                    f"Qwen2.5-VL: a {grid_h} x {grid_w} patch grid does not merge by "
                    f"{self.merge_size}"
                )
            pixels.append(image.reshape(grid_h * grid_w, -1))
            positions.append(self.positions(grid_h, grid_w))
            index, lengths = self.window_order(grid_h, grid_w)
            order.append(index + merged)
            windows += lengths
            whole.append(grid_h * grid_w)
            merged += grid_h * grid_w // unit
        window_index = torch.cat(order).to(weight.device)
        # Patches by merged patch, in window order (transformers' permute_input_for_window_attn).
        x = torch.cat(pixels).to(device=weight.device, dtype=weight.dtype)
        x = self.patch_embed(x).view(merged, unit, -1)[window_index].flatten(0, 1)
        pos = torch.cat(positions).to(weight.device).view(merged, unit, 2)[window_index]
        steps = torch.arange(0, self.rope_dim, 2, dtype=torch.float)  # on the CPU, as theirs
        inv_freq = (1.0 / self.rope_theta ** (steps / self.rope_dim)).to(weight.device)
        freqs = pos.flatten(0, 1)[..., None].float() * inv_freq
        freqs = freqs.flatten(1)  # [tokens, rows' then columns' frequencies]
        cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, whole if i in self.fullatt_blocks else windows)
        return self.merger(x)[torch.argsort(window_index)]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """From the whole checkpoint's tensors, by their Hugging Face names (either of
        VISION_PREFIXES; the text model's are left alone), taken themselves, as
        vision_weights.py has it."""
        weights = {}
        for name, tensor in state_dict.items():
            ours = vision_name(name)
            if ours is not None:
                weights[ours] = tensor
        load_vision_weights(self, weights, "Qwen2.5-VL")


def is_vision_name(name: str) -> bool:
    """Whether a checkpoint tensor is the vision tower's (the merger's included)."""
    return name.startswith(VISION_PREFIXES)


def vision_name(name: str) -> str | None:
    """A checkpoint tensor's name in Qwen2_5_VLVision, or None: not the vision side's."""
    for prefix in VISION_PREFIXES:
        if name.startswith(prefix):
            return name.removeprefix(prefix)
    return None
