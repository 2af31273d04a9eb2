"""Triton sampling: the GPU side of kernels/sampling.py.

Bias, penalties, banned and disallowed tokens are applied first by the reference's
batched torch ops (a handful of device ops, only in steps where some row has them);
then one program per row does the rest over the processed fp32 row, block by block:
the maximum, top-k's k-th largest logit and top-p's lightest kept weight by bisection
on their float bits (a pass per bit, never a sort), min-p, the draw (the first token at
which the running sum of kept weights passes u times their total) and, where asked, the
chosen token's logprob. Greedy rows take the first index of the maximum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from hetero_infer.kernels.sampling import SamplingTensors, process_logits_ref
from hetero_infer.kernels.triton_utils import device_info, next_pow2


@triton.jit
def _count_at_least(x_ptr, vocab, key, BLOCK: tl.constexpr):
    """How many of the row's logits have an ordered key >= key."""
    count = tl.zeros((), dtype=tl.int32)
    for start in range(0, vocab, BLOCK):
        col = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + col, mask=col < vocab, other=float("-inf"))
        bits = x.to(tl.int32, bitcast=True)
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as int order
        count += tl.sum(((ordered >= key) & (col < vocab)).to(tl.int32), 0)
    return count


@triton.jit
def _mass_above(x_ptr, vocab, top, temperature, kth, floor, BLOCK: tl.constexpr):
    """The float64 sum of the weights (at or above the k-th logit) strictly above floor."""
    mass = tl.zeros((), dtype=tl.float64)
    for start in range(0, vocab, BLOCK):
        col = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + col, mask=col < vocab, other=float("-inf"))
        w = tl.exp((x - top) / temperature)
        w = tl.where((x >= kth) & (col < vocab), w, 0.0)
        mass += tl.sum(tl.where(w > floor, w, 0.0).to(tl.float64), 0)
    return mass


@triton.jit
def _kept_weights(x_ptr, col, vocab, top, temperature, kth, threshold):
    """The weights of the block ``col`` of the row: w where kept, else 0, and the mask."""
    x = tl.load(x_ptr + col, mask=col < vocab, other=float("-inf"))
    w = tl.exp((x - top) / temperature)
    keep = (x >= kth) & (w >= threshold) & (w > 0) & (col < vocab)
    return tl.where(keep, w, 0.0), keep


@triton.jit
def _sample_kernel(
    tokens_ptr,
    logprobs_ptr,
    x_ptr,  # [rows, vocab] fp32, processed
    temperature_ptr,
    top_k_ptr,
    top_p_ptr,
    min_p_ptr,
    uniforms_ptr,
    wants_logprob_ptr,
    stride_x,
    vocab,
    BLOCK: tl.constexpr,
):
    """One row per program (kernels/sampling.py's definition):

    greedy (temperature 0): token = first argmax x
    else: w = exp((x - max x) / T), 0 below the k-th largest x (bisection on x's bits);
          keep w >= t where t = max(lightest top-p keeps, min_p) (bisection on w's bits:
          the least b with mass(w > float(b)) < top_p * mass(w));
          token = first i with cumsum(kept w)[i] > u * sum(kept w)
    logprob = x[token] - max x - log(sum exp(x - max x)), NaN unless asked
    """
    row = tl.program_id(0)
    x_ptr += row.to(tl.int64) * stride_x
    temperature = tl.load(temperature_ptr + row)
    top_k = tl.load(top_k_ptr + row)
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    u = tl.load(uniforms_ptr + row)

    top = tl.full((), float("-inf"), tl.float32)
    for start in range(0, vocab, BLOCK):
        col = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + col, mask=col < vocab, other=float("-inf"))
        top = tl.maximum(top, tl.max(x, 0))

    if temperature > 0:
        kth = tl.full((), float("-inf"), tl.float32)
        if (top_k > 0) & (top_k < vocab):
            # The largest ordered key with at least k logits at or above it: the k-th
            # largest logit's (int64: hi - lo spans 2^32).
            lo = tl.full((), -2147483647, tl.int64)
            hi = tl.full((), 2147483647, tl.int64)
            for _ in range(32):
                mid = lo + (hi - lo + 1) // 2
                if _count_at_least(x_ptr, vocab, mid, BLOCK) >= top_k:
                    lo = mid
                else:
                    hi = mid - 1
            key = lo.to(tl.int32)
            kth = (key ^ ((key >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)
        threshold = tl.zeros((), dtype=tl.float32)
        if top_p < 1.0:
            mass = _mass_above(x_ptr, vocab, top, temperature, kth, -1.0, BLOCK) * top_p
            # The least bits b with mass(w > float(b)) < mass; 1.0: nothing weighs more.
            lo_b = tl.zeros((), dtype=tl.int32)
            hi_b = tl.full((), 0x3F800000, tl.int32)
            for _ in range(31):
                mid = (lo_b + hi_b) // 2
                floor = mid.to(tl.float32, bitcast=True)
                if _mass_above(x_ptr, vocab, top, temperature, kth, floor, BLOCK) < mass:
                    hi_b = mid
                else:
                    lo_b = mid + 1
            threshold = hi_b.to(tl.float32, bitcast=True)
        threshold = tl.maximum(threshold, min_p)  # the heaviest weight is exp(0) = 1
        total = tl.zeros((), dtype=tl.float64)
        for start in range(0, vocab, BLOCK):
            col = start + tl.arange(0, BLOCK)
            w, _ = _kept_weights(x_ptr, col, vocab, top, temperature, kth, threshold)
            total += tl.sum(w.to(tl.float64), 0)
        target = u * total
        running = tl.zeros((), dtype=tl.float64)
        token = tl.full((), 2147483647, tl.int32)  # none yet
        last = tl.zeros((), dtype=tl.int32)
        for start in range(0, vocab, BLOCK):
            col = start + tl.arange(0, BLOCK)
            w, keep = _kept_weights(x_ptr, col, vocab, top, temperature, kth, threshold)
            kept = w.to(tl.float64)
            passed = (running + tl.cumsum(kept, 0) > target) & keep
            token = tl.minimum(token, tl.min(tl.where(passed, col, 2147483647), 0))
            last = tl.maximum(last, tl.max(tl.where(keep, col, 0), 0))
            running += tl.sum(kept, 0)
        token = tl.where(token < vocab, token, last)  # u * total rounded up to the total
    else:
        token = tl.full((), 2147483647, tl.int32)
        for start in range(0, vocab, BLOCK):
            col = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + col, mask=col < vocab, other=float("-inf"))
            token = tl.minimum(token, tl.min(tl.where(x == top, col, 2147483647), 0))
    tl.store(tokens_ptr + row, token.to(tl.int64))

    logprob = tl.full((), float("nan"), tl.float32)
    if tl.load(wants_logprob_ptr + row) != 0:
        sum_exp = tl.zeros((), dtype=tl.float32)
        for start in range(0, vocab, BLOCK):
            col = start + tl.arange(0, BLOCK)
            x = tl.load(x_ptr + col, mask=col < vocab, other=float("-inf"))
            sum_exp += tl.sum(tl.exp(x - top), 0)
        logprob = tl.load(x_ptr + token) - top - tl.log(sum_exp)
    tl.store(logprobs_ptr + row, logprob)


def sample_triton(logits: torch.Tensor, t: SamplingTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """kernels/sampling.py's sample on the GPU (or in the interpreter)."""
    assert logits.dim() == 2, logits.shape
    rows, vocab = logits.shape
    processed = process_logits_ref(logits, t) if t.has_processing else logits.float()
    processed = processed.contiguous()
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows == 0:
        return tokens, logprobs
    info = device_info(logits)
    block = min(next_pow2(vocab), info.max_tile if info.interpreter else 1024)
    _sample_kernel[(rows,)](
        tokens,
        logprobs,
        processed,
        t.temperature,
        t.top_k,
        t.top_p,
        t.min_p,
        t.uniforms,
        t.wants_logprob.to(torch.int8),
        processed.stride(0),
        vocab,
        BLOCK=block,
    )
    return tokens, logprobs
