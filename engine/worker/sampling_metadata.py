"""SamplingMetadata: a step's sampling as batched data, built once per step from the
scheduled rows (cf. vLLM's SamplingMetadata): the kernel's tensors (kernels/sampling.py's
SamplingTensors: per-row parameters, the tokens penalties count, bias and banned ids,
the grammar's bit masks, each random row's uniform) and what stays on the Python side
(who asked for how many top logprobs). Nothing after it walks a request's params."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hetero_infer.engine.core.step_data import ScheduledSequence
from hetero_infer.engine.params.structured_output import bitmask_words
from hetero_infer.engine.worker.randomness import SAMPLE_STREAM, Randomness
from hetero_infer.kernels import SamplingTensors


@dataclass(frozen=True)
class SamplingMetadata:
    # None for a batch of plain greedy rows (no logprobs, nothing to process): the
    # one-pass greedy kernel needs no parameters.
    tensors: SamplingTensors | None
    # Per row: how many top logprobs it asked for (None: no logprobs at all).
    num_logprobs: list[int | None]

    @classmethod
    def build(
        cls,
        rows: list[ScheduledSequence],
        vocab_size: int,
        device: torch.device,
        randomness: Randomness | None,
        stream: int = SAMPLE_STREAM,
    ) -> SamplingMetadata:
        """``randomness``: where the random rows' uniforms come from (``stream``'s);
        None where nothing is drawn (their probabilities only)."""
        params = [r.sampling_params for r in rows]
        num_logprobs = [p.logprobs for p in params]
        greedy = [p.greedy for p in params]
        if all(greedy) and not needs_processing(rows) and all(k is None for k in num_logprobs):
            return cls(None, num_logprobs)
        random = [i for i, g in enumerate(greedy) if not g]
        uniforms = torch.zeros(len(rows), dtype=torch.float64)
        if random and randomness is not None:
            drawn = randomness.uniforms(
                [params[i].seed for i in random], [rows[i].sample_position for i in random], stream
            )
            if len(random) == len(rows):
                uniforms = drawn
            else:
                uniforms[random] = drawn
        penalized = any(p.has_penalties for p in params)
        tensors = SamplingTensors.build(
            temperature=[0.0 if g else p.temperature for g, p in zip(greedy, params, strict=True)],
            top_k=[max(p.top_k, 0) for p in params],
            top_p=[p.top_p for p in params],
            min_p=[p.min_p for p in params],
            uniforms=uniforms,
            wants_logprob=[k is not None for k in num_logprobs],
            penalties=[
                (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) for p in params
            ]
            if penalized
            else None,
            prompt_ids=[_seen(r, r.prompt_token_ids) for r in rows] if penalized else None,
            output_ids=[_seen(r, r.output_token_ids) for r in rows] if penalized else None,
            bias=[p.logit_bias_tensors for p in params]
            if any(p.logit_bias for p in params)
            else None,
            banned=[r.banned_token_ids for r in rows]
            if any(r.banned_token_ids for r in rows)
            else None,
            allowed=_allowed(rows, vocab_size),
        )
        if device.type != "cpu":
            tensors = tensors.to(device)
        return cls(tensors, num_logprobs)


def needs_processing(rows: list[ScheduledSequence]) -> bool:
    """Whether any row has bias, penalties, banned or allowed tokens, or a grammar."""
    return any(
        r.grammar_bitmask is not None
        or r.sampling_params.allowed_token_ids
        or r.forced_token_id is not None
        or r.banned_token_ids
        or r.sampling_params.logit_bias
        or r.sampling_params.has_penalties
        for r in rows
    )


def _seen(row: ScheduledSequence, ids: list[int] | None) -> list[int]:
    """The tokens a row's penalties count (none for a row without penalties)."""
    return ids or [] if row.sampling_params.has_penalties else []


def _allowed(rows: list[ScheduledSequence], vocab_size: int) -> torch.Tensor | None:
    """The bit masks [rows, ceil(vocab / 32)] int32 of the tokens each row may take:
    its grammar's and its allowed_token_ids (both, where it has both), or only its
    forced token; all ones for rows with none; None where no row has any."""
    constrained = [
        i
        for i, r in enumerate(rows)
        if r.grammar_bitmask is not None
        or r.sampling_params.allowed_token_ids
        or r.forced_token_id is not None
    ]
    if not constrained:
        return None
    words = -(-vocab_size // 32)
    allowed = torch.full((len(rows), words), -1, dtype=torch.int32)
    for i in constrained:
        if rows[i].forced_token_id is not None:
            allowed[i] = ids_bitmask([rows[i].forced_token_id], words)
            continue
        if rows[i].grammar_bitmask is not None:
            mask = bitmask_words(rows[i].grammar_bitmask, vocab_size)
            allowed[i, : mask.numel()] = mask
        if ids := rows[i].sampling_params.allowed_token_ids:
            allowed[i] &= ids_bitmask(ids, words)
    return allowed


def ids_bitmask(token_ids: list[int], words: int) -> torch.Tensor:
    """[words] int32 with the bits of ``token_ids`` set (bit b of word w: token 32 w + b)."""
    ids = torch.tensor(sorted(set(token_ids)), dtype=torch.int64)
    bits = torch.zeros(words, dtype=torch.int64)
    bits.index_put_((ids // 32,), torch.ones_like(ids) << (ids % 32), accumulate=True)
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32)  # bit 31: the sign
