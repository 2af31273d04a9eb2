"""The reference our engine is measured against: transformers' greedy generate and
final hidden states, fp32."""

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


@torch.no_grad()
def transformers_embedding(model: torch.nn.Module, prompt: list[int], pooling: str) -> torch.Tensor:
    """One prompt's final hidden states (after the final norm) from a transformers base
    model (``AutoModel``), pooled ("last" token or "mean" over positions) and scaled to
    unit length: what /v1/embeddings must return. [hidden]"""
    hidden = model(torch.tensor([prompt])).last_hidden_state[0]  # [len(prompt), hidden]
    vector = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
    return torch.nn.functional.normalize(vector, dim=0)
