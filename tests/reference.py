"""The reference our engine is measured against: transformers' greedy generate, fp32."""

from __future__ import annotations

import torch


@torch.no_grad()
def transformers_greedy(
    model: torch.nn.Module, prompts: list[list[int]], max_new_tokens: int, **generate_kwargs
) -> list[list[int]]:
    """Each prompt's greedy continuation, one prompt at a time (no padding effects)."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **generate_kwargs,
        )
        outputs.append(out[0, len(prompt) :].tolist())
    return outputs
