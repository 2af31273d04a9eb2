"""A step's sampling: the logits rows of each sampling sequence (its last token's, and
its drafts' where it has any) to the tokens it keeps, with their logprobs.

The sampler picks a token at every row (sampler.py, over sampling_metadata.py's
tensors, each row's randomness from randomness.py). A sequence without drafts keeps
its one token; n-gram drafts are kept up to the first that differs from the pick at
its position (verifier.py); a draft model's drafts are accepted or resampled against
the draft's probabilities (rejection.py), which keeps the target's distribution.
"""

from __future__ import annotations

import torch
from hetero_infer.engine.core.step_data import SampledToken, ScheduledSequence
from hetero_infer.engine.worker.randomness import Randomness
from hetero_infer.engine.worker.rejection import rejection_sample
from hetero_infer.engine.worker.sampler import Sampler
from hetero_infer.engine.worker.sampling_metadata import SamplingMetadata
from hetero_infer.engine.worker.verifier import num_kept, verification_rows
from hetero_infer.kernels import KernelOps


class StepSampling:
    def __init__(self, ops: KernelOps, seed: int | None, device: torch.device) -> None:
        """``seed``: the engine's, for requests without a seed of their own."""
        self.sampler = Sampler(ops.sample, ops.greedy_pick)
        self.randomness = Randomness(seed, ops.uniforms)
        self.device = device

    def __call__(
        self,
        sampling: list[ScheduledSequence],
        logits: torch.Tensor,
        draft_probs: dict[str, torch.Tensor],
    ) -> dict[str, list[SampledToken]]:
        """The tokens each sampling sequence keeps, by request id. ``logits``: their
        rows in order [rows, vocab]; ``draft_probs``: a draft model's probabilities
        of its drafts, by request id (none for n-gram drafts)."""
        rows = [row for s in sampling for row in verification_rows(s)]
        meta = SamplingMetadata.build(rows, logits.shape[-1], self.device, self.randomness)
        tokens, logprobs, tops = self.sampler(logits, meta)
        sampled: dict[str, list[SampledToken]] = {}
        first = 0
        for s in sampling:
            end = first + 1 + s.num_draft_tokens
            q = draft_probs.get(s.request_id)
            if q is None:
                keep = num_kept(s.draft_token_ids, tokens[first:end])
                sampled[s.request_id] = [
                    SampledToken(tokens[r], logprobs[r], tops[r])
                    for r in range(first, first + keep)
                ]
            else:
                sampled[s.request_id] = self._rejection_sample(
                    s, q, logits[first:end], rows[first:end], tokens[end - 1]
                )
            first = end
        return sampled

    def _rejection_sample(
        self,
        item: ScheduledSequence,
        draft_probs: torch.Tensor,
        logits: torch.Tensor,
        rows: list[ScheduledSequence],
        bonus: int,
    ) -> list[SampledToken]:
        """A sampling sequence's tokens from a draft model's drafts (rejection.py),
        with the logprobs the sampler reports for them."""
        meta = SamplingMetadata.build(rows, logits.shape[-1], self.device, None)
        kept = rejection_sample(
            self.sampler.probabilities(logits, meta),  # [k + 1, vocab]
            draft_probs,
            list(item.draft_token_ids),
            bonus,
            item.sampling_params.seed,
            rows[0].sample_position,
            self.randomness,
        )
        n = len(kept)
        meta = SamplingMetadata.build(rows[:n], logits.shape[-1], self.device, None)
        chosen, tops = self.sampler.logprobs_of(logits[:n], meta, kept)
        return [SampledToken(t, c, top) for t, c, top in zip(kept, chosen, tops, strict=True)]
