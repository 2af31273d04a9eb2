"""SamplingMetadata: a step's sampling parameters as batched values, built once per step
from the scheduled rows (cf. vLLM's SamplingMetadata), so the sampler works on whole
batches instead of walking each request's params."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.engine.core.step_data import ScheduledSequence


@dataclass(frozen=True)
class SamplingMetadata:
    rows: list[ScheduledSequence]
    # Every row greedy, with no logprobs and nothing for process_logits: the one-pass path.
    all_plain_greedy: bool
    # Rows that sample at random, and for them: [num_random] temperatures, top-k (-1:
    # off), top-p and min-p, and each one's generator (None: the engine's shared one;
    # a seeded row's is seeded by its seed and sample position, see position_seed).
    random_rows: list[int]
    temperature: torch.Tensor | None
    top_k: list[int]
    top_p: list[float]
    min_p: torch.Tensor | None
    generators: list[torch.Generator | None]
    # Per row: how many top logprobs it asked for (None: not asked).
    num_logprobs: list[int | None]

    @classmethod
    def build(cls, rows: list[ScheduledSequence], device: torch.device) -> SamplingMetadata:
        params = [r.sampling_params for r in rows]
        num_logprobs = [p.logprobs for p in params]
        random_rows = [i for i, p in enumerate(params) if not p.greedy]
        chosen = [params[i] for i in random_rows]
        row_generators = [
            None
            if params[i].seed is None
            else torch.Generator().manual_seed(
                position_seed(params[i].seed, rows[i].sample_position)
            )
            for i in random_rows
        ]
        return cls(
            rows=rows,
            all_plain_greedy=not random_rows
            and all(k is None for k in num_logprobs)
            and not needs_processing(rows),
            random_rows=random_rows,
            temperature=torch.tensor([p.temperature for p in chosen], device=device)
            if chosen
            else None,
            top_k=[p.top_k for p in chosen],
            top_p=[p.top_p for p in chosen],
            min_p=torch.tensor([p.min_p for p in chosen], device=device) if chosen else None,
            generators=row_generators,
            num_logprobs=num_logprobs,
        )


def position_seed(seed: int, position: int, stream: int = 0) -> int:
    """The seed of a seeded request's draw at ``position``: a hash of both (Python
    hashes ints and tuples of ints the same in every process). ``stream`` > 0 names
    another draw at the same position, independent of the sampler's own (speculative
    decoding's draft and accept/reject draws)."""
    key = (seed, position, stream) if stream else (seed, position)
    return hash(key) & (2**63 - 1)


def needs_processing(rows: list[ScheduledSequence]) -> bool:
    """Whether any row has something for process_logits to do."""
    return any(
        r.grammar_bitmask is not None
        or r.banned_token_ids
        or r.sampling_params.logit_bias
        or r.sampling_params.has_penalties
        for r in rows
    )
