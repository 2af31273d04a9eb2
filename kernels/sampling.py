"""Sampling a batch of rows of logits: the definition, in torch, that the kernels follow.

A step's rows come with their parameters as tensors (``SamplingTensors``, built once
per step by the engine's SamplingMetadata). Each row, in vLLM's order:

1. logit bias is added; then penalties, on the tokens the row has seen: repetition
   (CTRL, vLLM's) divides a seen token's logit by the penalty when positive, multiplies
   it when negative; then OpenAI's ``logit -= frequency * count + presence * (count >
   0)`` over the output's counts; then banned tokens (min_tokens) and the tokens the
   grammar's bit mask does not allow are excluded. Those are the processed logits l.
2. A greedy row (temperature 0) takes the first index of the largest l.
3. A random row weighs each token w = exp((l - max l) / temperature), then truncates:
   - top-k keeps the tokens whose logit is at least the k-th largest (ties kept);
   - top-p keeps a token when the weight of the tokens strictly heavier than it is
     below top_p times the weight top-k kept (ties are kept or dropped together);
   - min-p keeps the tokens of weight at least min_p times the heaviest's.
   Every criterion is a threshold on a monotone function of the logit, so what is kept
   is every token at or above one weight: no sort is needed, only selection.
4. The draw takes one uniform u in [0, 1) per row (kernels/philox.py): the first token,
   in vocabulary order, at which the running sum of kept weights (in float64) exceeds
   u times their total. One random number per row, however large the vocabulary.
5. Where a row asks, the chosen token's log-probability under the processed logits
   (before temperature and truncation), as vLLM reports by default.

The kernels (C++: kernels/csrc/sampler_cpu.cpp; Triton: kernels/sampling_triton.py)
compute the same thing with vectorised passes over each row and selection in place of
sorting; their weights may differ from these in the last bit (each has its own exp),
so a draw whose u falls within rounding of a boundary between two tokens may differ.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import torch

Tensor = torch.Tensor

# What an excluded (banned, disallowed) token's processed logit becomes: -inf here; the
# C++ kernel, built with -ffast-math (no infinities), uses a finite sentinel instead.
EXCLUDED = float("-inf")


@dataclass(frozen=True)
class SamplingTensors:
    """One step's sampling parameters, one row per row of logits (all on one device).

    Sparse per-row lists are CSR: ``x_offsets`` [rows + 1] bounds row r's entries in
    ``x_ids[x_offsets[r]:x_offsets[r + 1]]``. A list no row has is empty (offsets all
    zero), and then costs nothing.
    """

    temperature: Tensor  # [rows] fp32; 0: greedy
    top_k: Tensor  # [rows] int64; 0: off
    top_p: Tensor  # [rows] fp32; 1: off
    min_p: Tensor  # [rows] fp32; 0: off
    uniforms: Tensor  # [rows] fp64 in [0, 1): each random row's draw
    wants_logprob: Tensor  # [rows] bool: report the chosen token's logprob
    # Penalties: [rows] fp32 each (0, 0, 1 where a row has none), or all empty [0].
    presence: Tensor
    frequency: Tensor
    repetition: Tensor
    # The tokens each penalized row has seen: its prompt and its output so far.
    prompt_offsets: Tensor
    prompt_ids: Tensor
    output_offsets: Tensor
    output_ids: Tensor
    # logit_bias: token ids and fp32 biases.
    bias_offsets: Tensor
    bias_ids: Tensor
    bias_values: Tensor
    # Tokens masked out until min_tokens: token ids.
    banned_offsets: Tensor
    banned_ids: Tensor
    # The grammar's bit masks, [rows, ceil(vocab / 32)] int32 (bit b of word w allows
    # token 32 w + b; -1 words for an unconstrained row), or empty [0, 0].
    allowed: Tensor

    @classmethod
    def build(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int],
        top_p: Sequence[float],
        min_p: Sequence[float],
        uniforms: Tensor,
        wants_logprob: Sequence[bool],
        penalties: Sequence[tuple[float, float, float]] | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None,
        output_ids: Sequence[Sequence[int]] | None = None,
        bias: Sequence[Mapping[int, float] | tuple[Tensor, Tensor]] | None = None,
        banned: Sequence[Collection[int]] | None = None,
        allowed: Tensor | None = None,
    ) -> SamplingTensors:
        """From per-row Python values, on the CPU. ``penalties``: (presence, frequency,
        repetition) per row, with ``prompt_ids`` and ``output_ids`` (the tokens each row
        has seen); ``bias``: token id -> bias, or (ids, biases) as tensors; ``banned``:
        token ids; None: no row has any."""
        prompt_offsets, prompt = _csr(prompt_ids if penalties else None)
        output_offsets, output = _csr(output_ids if penalties else None)
        bias_offsets, bias_ids, bias_values = _csr_pairs(bias)
        banned_offsets, banned_ids = _csr(banned)
        presence, frequency, repetition = (
            torch.tensor(list(zip(*penalties, strict=True)), dtype=torch.float32)
            if penalties
            else _EMPTY_FLOAT.expand(3, 0)
        )
        return cls(
            temperature=torch.tensor(temperature, dtype=torch.float32),
            top_k=torch.tensor(top_k, dtype=torch.int64),
            top_p=torch.tensor(top_p, dtype=torch.float32),
            min_p=torch.tensor(min_p, dtype=torch.float32),
            uniforms=uniforms,
            wants_logprob=torch.tensor(wants_logprob, dtype=torch.bool),
            presence=presence.contiguous(),
            frequency=frequency.contiguous(),
            repetition=repetition.contiguous(),
            prompt_offsets=prompt_offsets,
            prompt_ids=prompt,
            output_offsets=output_offsets,
            output_ids=output,
            bias_offsets=bias_offsets,
            bias_ids=bias_ids,
            bias_values=bias_values,
            banned_offsets=banned_offsets,
            banned_ids=banned_ids,
            allowed=allowed if allowed is not None else _EMPTY_INT.view(0, 0),
        )

    @property
    def has_penalties(self) -> bool:
        return self.presence.numel() > 0

    @property
    def has_processing(self) -> bool:
        """Whether any row has bias, penalties, banned tokens or a grammar."""
        return (
            self.has_penalties
            or self.bias_ids.numel() > 0
            or self.banned_ids.numel() > 0
            or self.allowed.numel() > 0
        )

    def select(self, rows: list[int]) -> SamplingTensors:
        """The tensors of some rows only, in that order."""
        index = torch.tensor(rows, dtype=torch.int64, device=self.temperature.device)
        picked = {
            name: getattr(self, name)[index]
            for name in _PER_ROW_FIELDS
            if getattr(self, name).numel()
        }
        for offsets, *lists in _CSR_FIELDS:
            entries, picked[offsets] = _select_csr(getattr(self, offsets), rows)
            for name in lists:
                picked[name] = getattr(self, name)[entries]
        return SamplingTensors(
            **{**{n: getattr(self, n) for n in self.__dataclass_fields__}, **picked}
        )

    def fields(self) -> list[Tensor]:
        """The tensors in declaration order (the kernels' argument order)."""
        return [getattr(self, name) for name in self.__dataclass_fields__]

    def to(self, device: torch.device) -> SamplingTensors:
        return SamplingTensors(*(t.to(device, non_blocking=True) for t in self.fields()))


# ---- the reference ----


def process_logits_ref(logits: Tensor, t: SamplingTensors) -> Tensor:
    """logits [rows, vocab] -> the processed logits l [rows, vocab] fp32 (step 1)."""
    logits = logits.float().clone()
    rows, vocab = logits.shape
    bias_rows = _csr_rows(t.bias_offsets)
    logits.index_put_((bias_rows, t.bias_ids), t.bias_values.float(), accumulate=True)
    if t.has_penalties:
        output_counts = _counts(t.output_offsets, t.output_ids, rows, vocab)
        seen = (_counts(t.prompt_offsets, t.prompt_ids, rows, vocab) > 0) | (output_counts > 0)
        rep = t.repetition[:, None].float()
        repeated = torch.where(logits > 0, logits / rep, logits * rep)
        logits = torch.where(seen, repeated, logits)
        logits -= t.frequency[:, None] * output_counts
        logits -= t.presence[:, None] * (output_counts > 0).float()
    logits[_csr_rows(t.banned_offsets), t.banned_ids] = EXCLUDED
    if t.allowed.numel():
        bits = (t.allowed[:, :, None] >> torch.arange(32, device=logits.device)) & 1
        allowed = bits.reshape(rows, -1)[:, :vocab].bool()
        logits = logits.masked_fill(~allowed, EXCLUDED)
    return logits


def truncated_weights_ref(
    processed: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, min_p: Tensor
) -> Tensor:
    """Processed logits [rows, vocab] of random rows and their [rows] parameters ->
    each token's weight after temperature and truncation (step 3), fp32, 0 where
    dropped; not normalised."""
    vocab = processed.shape[-1]
    top = processed.max(dim=-1, keepdim=True).values
    weights = torch.exp((processed - top) / temperature[:, None].float())
    k = top_k.clamp(min=0)
    if bool(((k > 0) & (k < vocab)).any()):
        k = torch.where((k == 0) | (k > vocab), vocab, k)
        kth = processed.topk(int(k.max()), dim=-1).values.gather(1, (k - 1)[:, None])
        weights = weights.masked_fill(processed < kth, 0.0)
    if bool((top_p < 1).any()):
        mass = weights.double().sum(dim=-1) * top_p.double()  # [rows]
        keep = (_mass_strictly_heavier(weights) < mass[:, None]) | (top_p[:, None] >= 1)
        weights = weights.masked_fill(~keep, 0.0)
    floor = min_p[:, None].float() * weights.max(dim=-1, keepdim=True).values
    return weights.masked_fill(weights < floor, 0.0)


def draw_ref(weights: Tensor, uniforms: Tensor) -> Tensor:
    """weights [rows, vocab] >= 0 (unnormalised), uniforms [rows] -> tokens [rows]: the
    first index at which the float64 running sum exceeds u times the total (step 4)."""
    running = weights.double().cumsum(dim=-1)
    target = (uniforms.double() * running[:, -1])[:, None]
    index = torch.searchsorted(running, target, right=True).squeeze(1)
    # u * total rounds below the total, but never trust it: the last kept token.
    last_kept = weights.shape[-1] - 1 - (weights > 0).flip(-1).int().argmax(dim=-1)
    return torch.minimum(index, last_kept)


def sample_ref(logits: Tensor, t: SamplingTensors) -> tuple[Tensor, Tensor]:
    """logits [rows, vocab] -> (tokens [rows] int64, the chosen tokens' logprobs [rows]
    fp32, NaN where a row did not ask)."""
    processed = process_logits_ref(logits, t)
    tokens = processed.argmax(dim=-1)
    random = t.temperature > 0
    if bool(random.any()):
        weights = truncated_weights_ref(
            processed[random],
            t.temperature[random],
            t.top_k[random],
            t.top_p[random],
            t.min_p[random],
        )
        tokens[random] = draw_ref(weights, t.uniforms[random])
    logprobs = processed.gather(1, tokens[:, None]).squeeze(1) - processed.logsumexp(dim=-1)
    return tokens, logprobs.masked_fill(~t.wants_logprob, float("nan"))


def _mass_strictly_heavier(weights: Tensor) -> Tensor:
    """[rows, vocab] -> for each token, the float64 sum of the weights strictly above
    its own."""
    ordered, order = weights.double().sort(dim=-1, descending=True)
    before = ordered.cumsum(dim=-1) - ordered  # mass ranked above, ties included
    # Within a run of equal weights, each takes the mass before the run's first.
    first_of_run = torch.searchsorted(-ordered, -ordered, side="left")
    heavier_sorted = before.gather(1, first_of_run)
    return torch.empty_like(heavier_sorted).scatter_(1, order, heavier_sorted)


_PER_ROW_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "uniforms",
    "wants_logprob",
    "presence",
    "frequency",
    "repetition",
    "allowed",
)
# Each CSR list: its offsets, then the tensors with one entry per id.
_CSR_FIELDS = (
    ("prompt_offsets", "prompt_ids"),
    ("output_offsets", "output_ids"),
    ("bias_offsets", "bias_ids", "bias_values"),
    ("banned_offsets", "banned_ids"),
)
_EMPTY_FLOAT = torch.empty(0, dtype=torch.float32)
_EMPTY_LONG = torch.empty(0, dtype=torch.int64)
_EMPTY_INT = torch.empty(0, dtype=torch.int32)


def _csr(lists: Sequence[Collection[int]] | None) -> tuple[Tensor, Tensor]:
    """Per-row lists of ids -> (offsets [rows + 1], ids) int64; empty for None (or
    when every list is empty)."""
    if not lists or not any(lists):
        return _EMPTY_LONG, _EMPTY_LONG
    offsets = torch.tensor([0, *itertools.accumulate(map(len, lists))], dtype=torch.int64)
    return offsets, torch.tensor(list(itertools.chain.from_iterable(lists)), dtype=torch.int64)


def _csr_pairs(
    rows: Sequence[Mapping[int, float] | tuple[Tensor, Tensor]] | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-row {id: value} (or (ids, values) tensors) -> (offsets, ids, values)."""
    if not rows:
        return _EMPTY_LONG, _EMPTY_LONG, _EMPTY_FLOAT
    pairs = [
        row
        if isinstance(row, tuple)
        else (
            torch.tensor(list(row), dtype=torch.int64),
            torch.tensor(list(row.values()), dtype=torch.float32),
        )
        for row in rows
    ]
    if not any(ids.numel() for ids, _ in pairs):
        return _EMPTY_LONG, _EMPTY_LONG, _EMPTY_FLOAT
    sizes = [ids.numel() for ids, _ in pairs]
    offsets = torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int64)
    return offsets, torch.cat([i for i, _ in pairs]), torch.cat([v for _, v in pairs])


def _select_csr(offsets: Tensor, rows: list[int]) -> tuple[Tensor, Tensor]:
    """CSR offsets and some rows -> (the entries of those rows, in order; their offsets)."""
    if not offsets.numel():
        return offsets, offsets
    bounds = offsets.tolist()
    entries = [j for r in rows for j in range(bounds[r], bounds[r + 1])]
    sizes = [bounds[r + 1] - bounds[r] for r in rows]
    device = offsets.device
    new_offsets = torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int64, device=device)
    return torch.tensor(entries, dtype=torch.int64, device=device), new_offsets


def _csr_rows(offsets: Tensor) -> Tensor:
    """CSR offsets [rows + 1] -> the row of each entry."""
    counts = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(counts.numel(), device=offsets.device), counts)


def _counts(offsets: Tensor, ids: Tensor, rows: int, vocab: int) -> Tensor:
    """[rows, vocab] fp32: how often each token id occurs in each row's CSR list."""
    counts = torch.zeros(rows, vocab, device=ids.device)
    if ids.numel():
        counts.index_put_((_csr_rows(offsets), ids), torch.ones_like(ids, dtype=torch.float), True)
    return counts
