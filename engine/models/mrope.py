"""M-RoPE (Qwen2-VL, Qwen2.5-VL): a head's frequencies in three sections (the config's
mrope_section, which sums to half the rotary dims), each rotated by its own row of the
token's positions: time, height, width (engine/worker/mrope_positions.py). Both halves
of the neox layout take the same split, as transformers recomposes its cos and sin.

The tables stay the one RoPE's; a step's rows are gathered from them per token and
section, and the rotary then runs over those rows as its tables, token i at row i.
"""

from __future__ import annotations

import torch


def mrope_rows(
    rope: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor, sections: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, head_dim] and positions [3, num_tokens] ->
    each token's cos and sin [num_tokens, head_dim]."""
    cos, sin = rope
    head_dim = cos.shape[1]
    section_of = torch.arange(len(sections), device=cos.device) % 3
    which = section_of.repeat_interleave(torch.tensor(sections, device=cos.device))
    if 2 * which.numel() != head_dim:
        raise ValueError(f"mrope_section {sections} does not cover half of {head_dim} dims")
    # [num_tokens, head_dim], laid out so that the tables' gathered rows are contiguous,
    # as the rotary kernels take them (gathered through the transpose they were not)
    rows = positions[torch.cat([which, which])].T.contiguous()
    columns = torch.arange(head_dim, device=cos.device)
    return cos[rows, columns], sin[rows, columns]
