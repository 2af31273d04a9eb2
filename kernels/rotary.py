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
    head_dim: int,
    base: float,
    scaling: dict[str, Any] | None,
    max_positions: int,
    rotary_dim: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, head_dim] for RoPE with ``scaling``. LongRoPE
    (Phi-3) gives two tables end to end, [2 * max_positions, head_dim]: its short
    factors' rows, then its long factors' (a position p takes row p + max_positions
    where the long ones apply), both times the attention factor, as transformers
    scales them.

    ``rotary_dim`` < head_dim (Phi-4-mini: RoPE on the first 3/4 of each head): the
    frequencies are the rotary dims', and the other half-columns rotate by nothing
    (cos 1, sin 0), so the kernels rotate whole heads as ever; the checkpoint's q/k
    rows are reordered to match (partial_rotary_order)."""
    rotary_dim = rotary_dim or head_dim
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type != "longrope":
        cos, sin = rope_cos_sin(rope_inv_freq(rotary_dim, base, scaling), max_positions)
        return _pass_through(cos, sin, head_dim)
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim
    tables = []
    for factors in (scaling["short_factor"], scaling["long_factor"]):
        inv_freq = 1.0 / (torch.tensor(factors, dtype=torch.float32) * base**exponents)
        cos, sin = rope_cos_sin(inv_freq, max_positions)
        factor = scaling["attention_factor"]
        tables.append(_pass_through(cos * factor, sin * factor, head_dim))
    return torch.cat([tables[0][0], tables[1][0]]), torch.cat([tables[0][1], tables[1][1]])


def _pass_through(
    cos: torch.Tensor, sin: torch.Tensor, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables [positions, rotary_dim] widened to head_dim: each half gets columns of cos
    1 and sin 0 after the rotary ones (x * 1 + y * 0 = x, exactly)."""
    pad = (head_dim - cos.shape[1]) // 2
    if pad == 0:
        return cos, sin
    half = cos.shape[1] // 2
    ones, zeros = torch.ones(cos.shape[0], pad), torch.zeros(cos.shape[0], pad)
    cos = torch.cat([cos[:, :half], ones, cos[:, half:], ones], dim=1)
    sin = torch.cat([sin[:, :half], zeros, sin[:, half:], zeros], dim=1)
    return cos, sin


def partial_rotary_order(head_dim: int, rotary_dim: int) -> torch.Tensor:
    """For each dim of a head as the kernels rotate it, the checkpoint's dim it takes.
    Transformers rotates dims i and i + rotary_dim / 2 together and passes the dims from
    rotary_dim on; the kernels rotate i with i + head_dim / 2. Each half here takes its
    rotary dims first, then half of the passed ones. q and k reordered alike leave q . k
    as it was."""
    half, rotary_half = head_dim // 2, rotary_dim // 2
    passed = torch.arange(rotary_dim, head_dim)
    return torch.cat(
        [
            torch.arange(rotary_half),
            passed[: half - rotary_half],
            torch.arange(rotary_half, rotary_dim),
            passed[half - rotary_half :],
        ]
    )


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
