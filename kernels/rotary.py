"""Rotary position embeddings (RoPE), with the frequency scalings Llama models use.

For each pair (x1, x2) of a head's rotated dims at position p with frequency f:
    x1' = x1 cos(p f) - x2 sin(p f),   x2' = x2 cos(p f) + x1 sin(p f)
Neox style pairs dim i with i + d/2 (Llama, Mistral, Qwen2); GPT-J style pairs
2i with 2i + 1. cos/sin are precomputed once per position.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def rope_inv_freq(head_dim: int, base: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], with linear or Llama-3 scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (base**exponents)
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type == "linear":
        return inv_freq / scaling["factor"]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise ValueError(f"rope scaling type {rope_type!r} is not supported")


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    # Long wavelengths are slowed by `factor`, short ones kept, the band between
    # interpolated smoothly (Llama 3.1's recipe).
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_len / low
    high_freq_wavelen = old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_tables(
    head_dim: int, base: float, scaling: dict[str, Any] | None, max_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, head_dim] for RoPE with ``scaling``. LongRoPE
    (Phi-3) gives two tables end to end, [2 * max_positions, head_dim]: its short
    factors' rows, then its long factors' (a position p takes row p + max_positions
    where the long ones apply), both times the attention factor, as transformers
    scales them."""
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type != "longrope":
        return rope_cos_sin(rope_inv_freq(head_dim, base, scaling), max_positions)
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    tables = []
    for factors in (scaling["short_factor"], scaling["long_factor"]):
        inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)
        cos, sin = rope_cos_sin(inv_freq, max_positions)
        tables.append((cos * scaling["attention_factor"], sin * scaling["attention_factor"]))
    return torch.cat([tables[0][0], tables[1][0]]), torch.cat([tables[0][1], tables[1][1]])


def rope_cos_sin(inv_freq: torch.Tensor, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, head_dim], each half repeated (neox layout)."""
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq.float())
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def rotary_ref(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    is_neox: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [num_tokens, num_heads, head_dim] and k [num_tokens, num_kv_heads, head_dim]."""
    cos = cos[positions].to(q.dtype).unsqueeze(1)  # [num_tokens, 1, head_dim]
    sin = sin[positions].to(q.dtype).unsqueeze(1)
    if not is_neox:
        # GPT-J pairs adjacent dims: use each frequency for both members of a pair.
        half = cos.shape[-1] // 2
        cos = cos[..., :half].repeat_interleave(2, dim=-1)
        sin = sin[..., :half].repeat_interleave(2, dim=-1)
    rotate = _rotate_half if is_neox else _rotate_pairs
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
