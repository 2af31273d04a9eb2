"""The sampler: a step's rows of logits and their SamplingMetadata -> tokens.

One kernel call samples the whole batch (kernels/sampling.py defines it: bias,
penalties, banned and disallowed tokens, then greedy or temperature with top-k, top-p
and min-p, and one keyed uniform per random row; C++ on the CPU, Triton on CUDA); a
batch of plain greedy rows takes the one-pass greedy kernel instead. Logprobs are
computed only for the rows that ask (none on the greedy kernel's path): the chosen
token's in the kernel, the top alternatives here, from the processed logits of those
rows alone.

The log-probabilities are of the distribution after logit bias, min_tokens masking,
the grammar and penalties, before temperature and top-k/top-p/min-p truncation: with
none of those set that is the model's raw distribution, which is what vLLM reports by
default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hetero_infer.engine.core.step_data import Logprobs
from hetero_infer.engine.worker.sampling_metadata import SamplingMetadata
from hetero_infer.kernels import (
    SamplingTensors,
    greedy_pick_ref,
    process_logits_ref,
    sample_ref,
    truncated_weights_ref,
)

# (logits [rows, vocab], with_logprobs) -> (each row's argmax token, its log-softmax
# value in fp32 or NaN)
GreedyPick = Callable[[torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]
# (logits [rows, vocab], SamplingTensors) -> (tokens, chosen logprobs or NaN)
SampleFn = Callable[[torch.Tensor, SamplingTensors], tuple[torch.Tensor, torch.Tensor]]


class Sampler:
    def __init__(self, sample: SampleFn = sample_ref, greedy_pick: GreedyPick = greedy_pick_ref):
        """The engine's kernels (its KernelOps'; the torch references by default)."""
        self.sample = sample
        self.greedy_pick = greedy_pick

    @torch.no_grad()
    def __call__(
        self, logits: torch.Tensor, meta: SamplingMetadata
    ) -> tuple[list[int], list[float], list[Logprobs | None]]:
        """logits [rows, vocab] -> (token ids, their logprobs (NaN where not asked), top
        logprobs where asked: {chosen token: logprob, then the row's best k: theirs})."""
        if meta.tensors is None:  # greedy rows that ask for no logprobs
            tokens, chosen = self.greedy_pick(logits, False)
            return tokens.tolist(), chosen.tolist(), [None] * logits.shape[0]
        tokens, chosen = self.sample(logits, meta.tensors)
        token_list, chosen_list = tokens.tolist(), chosen.tolist()
        return token_list, chosen_list, self._top_logprobs(logits, meta, token_list, chosen_list)

    @torch.no_grad()
    def logprobs_of(
        self, logits: torch.Tensor, meta: SamplingMetadata, tokens: list[int]
    ) -> tuple[list[float], list[Logprobs | None]]:
        """The logprobs (and top logprobs, where asked) that __call__ would report had it
        picked ``tokens``: for tokens chosen elsewhere (speculative decoding's rejection
        sampling)."""
        assert meta.tensors is not None
        processed = process_logits_ref(logits, meta.tensors)
        index = torch.tensor(tokens, device=logits.device)[:, None]
        chosen = (processed.gather(1, index).squeeze(1) - processed.logsumexp(dim=-1)).tolist()
        return chosen, self._top_logprobs(logits, meta, tokens, chosen)

    @torch.no_grad()
    def probabilities(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """logits [rows, vocab] of rows that sample at random -> the distribution __call__
        draws each row's token from, normalised [rows, vocab] fp32."""
        t = meta.tensors
        assert t is not None and bool((t.temperature > 0).all()), "greedy rows have none"
        weights = truncated_weights_ref(
            process_logits_ref(logits, t), t.temperature, t.top_k, t.top_p, t.min_p
        )
        return weights / weights.sum(dim=-1, keepdim=True)

    def _top_logprobs(
        self, logits: torch.Tensor, meta: SamplingMetadata, tokens: list[int], chosen: list[float]
    ) -> list[Logprobs | None]:
        """Per row that asked: {chosen token: logprob, then its k best: theirs}; the k
        best come from the processed logits of the rows with k > 0 only."""
        ks = meta.num_logprobs
        asking = [i for i, k in enumerate(ks) if k]
        best: dict[int, tuple[list[float], list[int]]] = {}
        if asking:
            assert meta.tensors is not None
            rows = meta.tensors.select(asking)
            logprobs = torch.log_softmax(process_logits_ref(logits[asking], rows), dim=-1)
            values, ids = logprobs.topk(max(ks[i] for i in asking), dim=-1)
            best = dict(zip(asking, zip(values.tolist(), ids.tolist(), strict=True), strict=True))
        out: list[Logprobs | None] = []
        for i, k in enumerate(ks):
            if k is None:
                out.append(None)
                continue
            row = {tokens[i]: chosen[i]}
            if k:
                values, ids = best[i]
                for token_id, value in zip(ids[:k], values[:k], strict=True):
                    row.setdefault(token_id, value)
            out.append(row)
        return out
