"""Prompt logprobs: for the prompt positions a step computed, the model's prediction of
the next prompt token (vLLM's ``prompt_logprobs``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hetero_infer.engine.core.step_data import Logprobs, RankedLogprobs, ScheduledSequence


def prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    scheduled: list[ScheduledSequence],
    hidden: torch.Tensor,
) -> dict[str, list[Logprobs]]:
    """Each sequence's logprobs for the prompt positions this step computed.

    Position p's logits predict prompt token p + 1. Only positions past those the
    sequence has (a recomputed prompt would repeat them). These are the model's raw
    logprobs, as vLLM gives prompt logprobs, with each prompt token's rank.
    ``hidden``: [num_tokens, hidden]; ``compute_logits``: the runner's (hidden rows ->
    logits).
    """
    rows: list[int] = []
    targets: list[tuple[ScheduledSequence, int]] = []  # (sequence, prompt token predicted)
    offset = 0
    for item in scheduled:
        have = item.num_prompt_logprobs
        if have is not None and item.prompt_token_ids is not None:
            num_prompt = len(item.prompt_token_ids)
            assert item.start + 1 <= have or item.start >= num_prompt
            for p in range(item.start, item.start + item.num_new_tokens):
                if have <= p + 1 < num_prompt:
                    rows.append(offset + p - item.start)
                    targets.append((item, p + 1))
        offset += item.num_new_tokens
    if not rows:
        return {}
    # [len(rows), vocab]
    logprobs = torch.log_softmax(compute_logits(hidden[rows]).float(), dim=-1).cpu()
    token_ids = torch.tensor([item.prompt_token_ids[i] for item, i in targets])
    chosen_values = logprobs.gather(1, token_ids[:, None])
    # counted in int32: a sum of bools in torch's default int64 takes ~2x as long
    ranks = ((logprobs > chosen_values).sum(dim=1, dtype=torch.int32) + 1).tolist()
    chosen = chosen_values.squeeze(1).tolist()
    k_max = max(item.sampling_params.prompt_logprobs or 0 for item, _ in targets)
    top_values, top_ids = logprobs.topk(k_max, dim=-1)
    found: dict[str, list[Logprobs]] = {}
    for j, (item, i) in enumerate(targets):
        k = item.sampling_params.prompt_logprobs or 0
        entry = {item.prompt_token_ids[i]: chosen[j]}
        top = zip(top_ids[j, :k].tolist(), top_values[j, :k].tolist(), strict=True)
        for token_id, value in top:
            entry.setdefault(token_id, value)
        found.setdefault(item.request_id, []).append(RankedLogprobs(entry, ranks[j]))
    return found
