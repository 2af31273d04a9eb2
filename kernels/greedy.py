"""Greedy sampling's reference: each row's argmax token and its log-probability."""

from __future__ import annotations

import torch


def greedy_pick_ref(
    logits: torch.Tensor, with_logprobs: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] -> (argmax token ids [rows], their log-softmax values [rows]
    computed in fp32, or NaN without ``with_logprobs``)."""
    tokens = logits.argmax(dim=-1)
    if not with_logprobs:
        return tokens, torch.full(tokens.shape, float("nan"), device=logits.device)
    logits = logits.float()
    chosen = logits.gather(1, tokens[:, None]).squeeze(1) - logits.logsumexp(dim=-1)
    return tokens, chosen
