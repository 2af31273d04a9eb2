"""Greedy sampling's reference: each row's argmax token and its log-probability."""

from __future__ import annotations

import torch


def greedy_pick_ref(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [rows, vocab] -> (argmax token ids [rows], their log-softmax values [rows]),
    computed in fp32."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    chosen = logits.gather(1, tokens[:, None]).squeeze(1) - logits.logsumexp(dim=-1)
    return tokens, chosen
