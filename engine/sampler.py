"""Batched token sampling: greedy, temperature, top-k, top-p, min-p, per-request seeds.

All rows are processed together; only the random draw is per row for seeded
requests, so a seeded request gets the same tokens whatever else is in the batch.
Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) picks token i
with probability p_i, and lets each row draw its noise from its own generator.
"""

from __future__ import annotations

import torch

from engine.sequence import Sequence


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        # Unseeded requests share one generator, seeded once per engine so runs repeat.
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> tuple[list[int], list[float]]:
        """logits [num_seqs, vocab] fp32 -> (token ids, log-probabilities of those tokens).

        The log-probabilities are of the model's raw distribution (before temperature
        and truncation), as vLLM reports them by default.
        """
        logits = logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        random_rows = [i for i, s in enumerate(seqs) if not s.sampling_params.greedy]
        if random_rows:
            rows = torch.tensor(random_rows, device=logits.device)
            picked = self._sample(logits[rows], [seqs[i] for i in random_rows])
            tokens[rows] = picked
        chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
        return tokens.tolist(), chosen.tolist()

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        device = logits.device
        params = [s.sampling_params for s in seqs]
        temperature = torch.tensor([p.temperature for p in params], device=device)
        logits = logits / temperature[:, None]
        logits = apply_top_k_top_p(
            logits,
            top_k=[p.top_k for p in params],
            top_p=[p.top_p for p in params],
        )
        probs = torch.softmax(logits, dim=-1)
        min_p = torch.tensor([p.min_p for p in params], device=device)
        if bool((min_p > 0).any()):
            threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < threshold, 0.0)
        return (probs / self._exponential_noise(probs.shape, seqs)).argmax(dim=-1)

    def _exponential_noise(self, shape: torch.Size, seqs: list[Sequence]) -> torch.Tensor:
        noise = torch.empty(shape).exponential_(generator=self.generator)
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                noise[i].exponential_(generator=seq.generator)
        return noise


def apply_top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask to -inf every logit outside each row's top k and top-p nucleus."""
    use_top_k = any(k > 0 for k in top_k)
    use_top_p = any(p < 1.0 for p in top_p)
    if not (use_top_k or use_top_p):
        return logits
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if use_top_k:
        k = torch.tensor(
            [min(kk, vocab) if kk > 0 else vocab for kk in top_k], device=logits.device
        )
        remove |= torch.arange(vocab, device=logits.device)[None, :] >= k[:, None]
    if use_top_p:
        p = torch.tensor(top_p, device=logits.device, dtype=logits.dtype)
        probs = torch.softmax(sorted_logits.masked_fill(remove, float("-inf")), dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p.
        mass_before = probs.cumsum(dim=-1) - probs
        remove |= mass_before >= p[:, None]
    remove[:, 0] = False  # the most likely token always stays
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
