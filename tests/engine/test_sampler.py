"""The sampler on known logits: greedy, truncation, seeds, and the sampled distribution."""

from __future__ import annotations

import torch

from engine.sampler import Sampler, apply_top_k_top_p
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence


def _seqs(*params: SamplingParams) -> list[Sequence]:
    return [Sequence(str(i), None, [1], p) for i, p in enumerate(params)]


def test_greedy_picks_argmax_and_reports_raw_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, -1.0]])
    tokens, logprobs = Sampler()(
        logits, _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0))
    )
    assert tokens == [1, 0]
    expected = torch.log_softmax(logits, -1)[[0, 1], [1, 0]]
    torch.testing.assert_close(torch.tensor(logprobs), expected)


def test_top_k_top_p_mask_matches_reference():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0, 0.0]] * 3)
    masked = apply_top_k_top_p(logits, top_k=[2, -1, -1], top_p=[1.0, 0.7, 1.0])
    kept = torch.isfinite(masked)
    # top_k=2 keeps the two largest; top_p=0.7 keeps the smallest prefix whose mass reaches 0.7
    probs = torch.softmax(logits[1], -1).sort(descending=True).values
    n_keep = int((probs.cumsum(0) - probs < 0.7).sum())
    assert kept[0].tolist() == [False, True, True, False, False]
    assert int(kept[1].sum()) == n_keep
    assert kept[2].all()


def test_top_k_beyond_the_vocab_keeps_everything():
    logits = torch.randn(1, 10)
    assert torch.equal(apply_top_k_top_p(logits, top_k=[2**70], top_p=[1.0]), logits)


def test_truncation_to_one_token_is_greedy():
    logits = torch.randn(4, 50)
    seqs = _seqs(
        SamplingParams(top_k=1),
        SamplingParams(top_p=1e-6),
        SamplingParams(min_p=1.0),
        SamplingParams(temperature=1e-7),
    )
    tokens, _ = Sampler()(logits, seqs)
    assert tokens == logits.argmax(-1).tolist()


def test_seeded_rows_do_not_depend_on_the_batch():
    torch.manual_seed(0)
    logits = torch.randn(3, 100)
    seeded = SamplingParams(temperature=1.0, seed=42)

    def draws(batch_logits, params_list):
        seqs = _seqs(*params_list)
        sampler = Sampler(seed=123)
        return [sampler(batch_logits, seqs)[0] for _ in range(20)]

    alone = [t[0] for t in draws(logits[:1], [seeded])]
    crowded = [t[1] for t in draws(logits[[1, 0, 2]], [SamplingParams(), seeded, SamplingParams()])]
    assert alone == crowded


def test_sampled_frequencies_follow_temperature_softmax():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    params = SamplingParams(temperature=0.7, seed=0)
    seq = _seqs(params)
    sampler = Sampler()
    counts = torch.zeros(4)
    n = 4000
    for _ in range(n):
        counts[sampler(logits, seq)[0][0]] += 1
    expected = torch.softmax(logits[0] / 0.7, -1)
    assert torch.allclose(counts / n, expected, atol=0.03)
