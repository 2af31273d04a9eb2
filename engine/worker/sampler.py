"""Batched token sampling: logit bias, min_tokens, penalties, then greedy or temperature
with top-k, top-p, min-p, and per-request seeds.

All rows are processed together; only the random draw is per row for seeded
requests. Sampling uses the exponential race: argmax(p / E) with E ~ Exp(1) picks token
i with probability p_i, and lets each row draw its noise from its own generator. A
seeded request's row draws from a generator seeded by (seed, position of the token
sampled), so its tokens depend neither on what else is in the batch nor on how its
tokens were spread over steps (speculative decoding verifies several in one).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from hetero_infer.engine.core.step_data import ScheduledSequence
from hetero_infer.engine.structured_output import allowed_tokens
from hetero_infer.engine.worker.sampling_metadata import SamplingMetadata, needs_processing
from hetero_infer.kernels.greedy import greedy_pick_ref

# logits [rows, vocab] -> (each row's argmax token, its log-softmax value in fp32)
GreedyPick = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Sampler:
    def __init__(self, seed: int = 0, greedy_pick: GreedyPick = greedy_pick_ref) -> None:
        """``greedy_pick``: the engine's kernel for the common all-greedy batch (its
        KernelOps'; the torch reference by default)."""
        # Unseeded requests share one generator, seeded once per engine so runs repeat.
        self.generator = torch.Generator().manual_seed(seed)
        self.greedy_pick = greedy_pick

    @torch.no_grad()
    def __call__(
        self, logits: torch.Tensor, seqs: list[ScheduledSequence]
    ) -> tuple[list[int], list[float], list[dict[int, float] | None]]:
        """logits [num_seqs, vocab] -> (token ids, their logprobs, top logprobs when asked).

        The log-probabilities are of the distribution after logit bias, min_tokens
        masking and penalties, before temperature and top-k/top-p/min-p truncation:
        with none of those set (and always for greedy rows without them) that is the
        model's raw distribution, which is what vLLM reports by default. The top
        logprobs map the chosen token and the row's ``logprobs`` best to theirs.
        """
        meta = SamplingMetadata.build(seqs, logits.device)
        if meta.all_plain_greedy:
            # The common case in one pass per row, on the model's own logits.
            tokens, chosen = self.greedy_pick(logits)
            return tokens.tolist(), chosen.tolist(), [None] * len(seqs)
        logits = process_logits(logits.float(), seqs)
        tokens = logits.argmax(dim=-1)
        if meta.random_rows:
            rows = torch.tensor(meta.random_rows, device=logits.device)
            tokens[rows] = self._sample(logits[rows], meta)
        token_list = tokens.tolist()
        chosen_list, tops = _logprobs(logits, tokens, token_list, meta.num_logprobs)
        return token_list, chosen_list, tops

    @torch.no_grad()
    def logprobs_of(
        self, logits: torch.Tensor, seqs: list[ScheduledSequence], tokens: list[int]
    ) -> tuple[list[float], list[dict[int, float] | None]]:
        """The logprobs (and top logprobs, where asked) that __call__ would report had it
        picked ``tokens``: for tokens chosen elsewhere (speculative decoding's rejection
        sampling)."""
        logits = process_logits(logits.float(), seqs)
        index = torch.tensor(tokens, device=logits.device)
        return _logprobs(logits, index, tokens, [s.sampling_params.logprobs for s in seqs])

    @torch.no_grad()
    def probabilities(self, logits: torch.Tensor, seqs: list[ScheduledSequence]) -> torch.Tensor:
        """logits [rows, vocab] of rows that sample at random -> the distribution __call__
        draws each row's token from, normalised [rows, vocab] fp32."""
        meta = SamplingMetadata.build(seqs, logits.device)
        assert len(meta.random_rows) == len(seqs), "greedy rows have no distribution"
        probs = sampling_probs(process_logits(logits.float(), seqs), meta)
        return probs / probs.sum(dim=-1, keepdim=True)

    def _sample(self, logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
        """logits [num_random, vocab] of the random rows -> their picks."""
        probs = sampling_probs(logits, meta)
        noise = self._exponential_noise(probs.shape, meta.generators).to(probs.device)
        return (probs / noise).argmax(dim=-1)

    def _exponential_noise(
        self, shape: torch.Size, generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        # Drawn on the CPU, where the generators live, whatever device the logits are on
        # (the caller moves it): a seed gives the same noise on every device.
        noise = torch.empty(shape).exponential_(generator=self.generator)
        for i, generator in enumerate(generators):
            if generator is not None:
                noise[i].exponential_(generator=generator)
        return noise


def sampling_probs(logits: torch.Tensor, meta: SamplingMetadata) -> torch.Tensor:
    """logits [num_random, vocab] of the random rows (processed) -> the probabilities
    each draws from, after temperature, top-k, top-p and min-p; the rows are not
    renormalised after min-p (a draw by argmax(p / noise) needs no normalising)."""
    logits = logits / meta.temperature[:, None]
    logits = apply_top_k_top_p(logits, top_k=meta.top_k, top_p=meta.top_p)
    probs = torch.softmax(logits, dim=-1)
    min_p = meta.min_p
    if bool((min_p > 0).any()):
        threshold = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def _logprobs(
    logits: torch.Tensor, chosen_ids: torch.Tensor, tokens: list[int], ks: list[int | None]
) -> tuple[list[float], list[dict[int, float] | None]]:
    """The chosen tokens' (``chosen_ids`` [rows], the same as ``tokens``) logprobs under
    the processed ``logits`` [rows, vocab], and the top logprobs of the rows that asked
    (``ks``)."""
    index = chosen_ids[:, None]
    if any(k is not None for k in ks):
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(1, index).squeeze(1)
    else:
        # Only the chosen tokens' logprobs: one reduction per row instead of a
        # whole [rows, vocab] log-softmax (15 ms a step at 128 rows of SmolLM2).
        logprobs = None
        chosen = logits.gather(1, index).squeeze(1) - logits.logsumexp(dim=-1)
    chosen_list = chosen.tolist()
    return chosen_list, top_logprobs(logprobs, tokens, chosen_list, ks)


def top_logprobs(
    logprobs: torch.Tensor | None,
    tokens: list[int],
    chosen: list[float],
    ks: list[int | None],
) -> list[dict[int, float] | None]:
    """Per row that asked (``ks``: how many top ones, None: not asked): {chosen token:
    logprob, then the k most likely: theirs}. ``logprobs`` (the rows' log-softmax) is
    None when no row asked."""
    if all(k is None for k in ks):
        return [None] * len(ks)
    k_max = max(k or 0 for k in ks)
    top_values, top_ids = (
        logprobs.topk(k_max, dim=-1) if k_max else (logprobs[:, :0], logprobs[:, :0].long())
    )
    values, ids = top_values.tolist(), top_ids.tolist()
    out: list[dict[int, float] | None] = []
    for i, k in enumerate(ks):
        if k is None:
            out.append(None)
            continue
        row = {tokens[i]: chosen[i]}
        for token_id, value in zip(ids[i][:k], values[i][:k], strict=True):
            row.setdefault(token_id, value)
        out.append(row)
    return out


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


def process_logits(logits: torch.Tensor, seqs: list[ScheduledSequence]) -> torch.Tensor:
    """Logit bias, min_tokens masking, the grammar's mask and penalties, in vLLM's order,
    on [num_seqs, vocab]."""
    if not needs_processing(seqs):
        return logits
    params = [s.sampling_params for s in seqs]
    constrained = [i for i, s in enumerate(seqs) if s.grammar_bitmask is not None]
    logits = logits.clone()  # the caller's tensor stays the model's output
    vocab = logits.shape[-1]
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for i, (seq, p) in enumerate(zip(seqs, params, strict=True)):
        for token_id, bias in p.logit_bias.items():
            rows.append(i)
            cols.append(token_id)
            values.append(bias)
        for token_id in seq.banned_token_ids:  # not before min_tokens
            if token_id < vocab:
                rows.append(i)
                cols.append(token_id)
                values.append(float("-inf"))
    if rows:
        device = logits.device
        index = (torch.tensor(rows, device=device), torch.tensor(cols, device=device))
        bias = torch.tensor(values, dtype=logits.dtype, device=device)
        # accumulate: a token both biased and banned ends at -inf
        logits.index_put_(index, bias, accumulate=True)
    if constrained:
        bitmasks = [seqs[i].grammar_bitmask for i in constrained]
        allowed = allowed_tokens(bitmasks, vocab, logits.device)
        logits[constrained] = logits[constrained].masked_fill(~allowed, float("-inf"))
    penalized = [i for i, p in enumerate(params) if p.has_penalties]
    if penalized:
        picked = [seqs[i] for i in penalized]
        logits[penalized] = apply_penalties(
            logits[penalized],
            prompt_ids=[s.prompt_token_ids for s in picked],
            output_ids=[s.output_token_ids for s in picked],
            presence=[s.sampling_params.presence_penalty for s in picked],
            frequency=[s.sampling_params.frequency_penalty for s in picked],
            repetition=[s.sampling_params.repetition_penalty for s in picked],
        )
    return logits


def apply_penalties(
    logits: torch.Tensor,
    prompt_ids: list[list[int]],
    output_ids: list[list[int]],
    presence: list[float],
    frequency: list[float],
    repetition: list[float],
) -> torch.Tensor:
    """Penalties on [rows, vocab] logits, all rows at once.

    repetition (vLLM's, from CTRL): a token seen in the prompt or the output has its
    logit divided by the penalty when positive, multiplied when negative. Then
    OpenAI's: logit -= frequency * count_in_output + presence * (count_in_output > 0).
    """
    vocab = logits.shape[-1]
    output_counts = token_counts(output_ids, vocab, logits.device)  # [rows, vocab]
    seen = (token_counts(prompt_ids, vocab, logits.device) > 0) | (output_counts > 0)
    rep = torch.tensor(repetition, dtype=logits.dtype, device=logits.device)[:, None]
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    freq = torch.tensor(frequency, dtype=logits.dtype, device=logits.device)[:, None]
    pres = torch.tensor(presence, dtype=logits.dtype, device=logits.device)[:, None]
    return logits - freq * output_counts - pres * (output_counts > 0).to(logits.dtype)


def token_counts(ids: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """How often each token id occurs in each row's list -> [rows, vocab] float."""
    width = max((len(row) for row in ids), default=0)
    # Padding points at an extra column that is dropped afterwards.
    padded = torch.full((len(ids), max(width, 1)), vocab, dtype=torch.long)
    for i, row in enumerate(ids):
        if row:
            padded[i, : len(row)] = torch.tensor(row)
    counts = torch.zeros(len(ids), vocab + 1)
    counts.scatter_add_(1, padded, torch.ones_like(padded, dtype=counts.dtype))
    return counts[:, :vocab].to(device)
