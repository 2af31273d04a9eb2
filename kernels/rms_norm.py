"""RMSNorm, optionally fused with the residual add that precedes it.

y = x / sqrt(mean(x^2) + eps) * weight, computed in fp32, cast back to x's dtype
before the weight multiply (the order Hugging Face's Llama uses, so fp32 results
match it bit for bit).
"""

from __future__ import annotations

import torch


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [num_tokens, hidden]
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual)."""
    residual = residual + x
    return rms_norm_ref(residual, weight, eps), residual
