"""The sampler on known logits: greedy, truncation, seeds, and the sampled distribution."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hetero_infer.engine.core.scheduler import schedule_entry
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.step_data import ScheduledSequence
from hetero_infer.engine.sampling_params import SamplingParams
from hetero_infer.engine.worker.sampler import Sampler, apply_top_k_top_p, process_logits


def _row(
    request_id: str, params: SamplingParams, prompt: list[int], output: list[int]
) -> ScheduledSequence:
    """What the scheduler hands the sampler for a sequence about to sample."""
    seq = Sequence(request_id, prompt, params, eos_token_ids=frozenset({0}))
    seq.token_ids += output
    seq.num_computed_tokens = seq.num_tokens - 1
    return schedule_entry(seq, 1)


def _seqs(*params: SamplingParams) -> list[ScheduledSequence]:
    return [_row(str(i), p, [1], []) for i, p in enumerate(params)]


def test_greedy_picks_argmax_and_reports_raw_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, -1.0]])
    tokens, logprobs, _ = Sampler()(
        logits, _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0))
    )
    assert tokens == [1, 0]
    expected = torch.log_softmax(logits, -1)[[0, 1], [1, 0]]
    torch.testing.assert_close(torch.tensor(logprobs), expected)


def test_chosen_logprob_is_the_same_whether_or_not_top_logprobs_are_asked():
    # Without logprobs the sampler computes only the chosen tokens' (via logsumexp).
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    plain = [SamplingParams(temperature=0), SamplingParams(temperature=0.8, seed=3)] * 2
    asked = [SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=0.8, seed=3)] * 2
    tokens, logprobs, tops = Sampler()(logits, _seqs(*plain))
    tokens_asked, logprobs_asked, tops_asked = Sampler()(logits, _seqs(*asked))
    assert tokens == tokens_asked and tops == [None] * 4
    torch.testing.assert_close(torch.tensor(logprobs), torch.tensor(logprobs_asked))
    expected = torch.log_softmax(logits, -1)[range(4), tokens]
    torch.testing.assert_close(torch.tensor(logprobs), expected)
    assert tops_asked[0] is not None and tops_asked[1] is None


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
    tokens, _, _ = Sampler()(logits, seqs)
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
    (row,) = _seqs(params)
    sampler = Sampler()
    counts = torch.zeros(4)
    n = 4000
    for position in range(n):
        # A seeded request draws each position's noise from (seed, position).
        at_position = dataclasses.replace(row, start=position)
        counts[sampler(logits, [at_position])[0][0]] += 1
    expected = torch.softmax(logits[0] / 0.7, -1)
    assert torch.allclose(counts / n, expected, atol=0.03)


# ---- logit bias, min_tokens, penalties: against a plain per-token reference ----


def _seq_with(params: SamplingParams, prompt: list[int], output: list[int]) -> ScheduledSequence:
    return _row("r", params, prompt, output)


def _reference(logits: list[float], params: SamplingParams, prompt, output) -> list[float]:
    """The definitions, one token at a time: bias, then repetition, then OpenAI's penalties."""
    out = list(logits)
    for token_id, bias in params.logit_bias.items():
        out[token_id] += bias
    for token_id in range(len(out)):
        if token_id in prompt or token_id in output:
            r = params.repetition_penalty
            out[token_id] = out[token_id] / r if out[token_id] > 0 else out[token_id] * r
        count = output.count(token_id)
        out[token_id] -= params.frequency_penalty * count
        out[token_id] -= params.presence_penalty * (count > 0)
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(presence_penalty=1.5),
        SamplingParams(frequency_penalty=0.7),
        SamplingParams(presence_penalty=-0.5, frequency_penalty=-2.0),
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(repetition_penalty=0.8, frequency_penalty=0.3, presence_penalty=0.4),
        SamplingParams(logit_bias={3: 5.0, 7: -100.0}),
        SamplingParams(logit_bias={1: -2.5}, repetition_penalty=1.5, presence_penalty=2.0),
    ],
)
def test_penalties_and_bias_match_the_reference(params):
    torch.manual_seed(0)
    logits = torch.randn(3, 10) * 3
    histories = [([1, 2, 3], [4, 4, 5, 1]), ([9], []), ([0, 0], [7, 7, 7, 8, 3])]
    seqs = [_seq_with(params, p, o) for p, o in histories]
    got = process_logits(logits, seqs)
    for row, (prompt, output) in enumerate(histories):
        expected = _reference(logits[row].tolist(), params, prompt, output)
        torch.testing.assert_close(got[row], torch.tensor(expected))


def test_rows_without_penalties_are_untouched_beside_penalized_ones():
    logits = torch.randn(2, 10)
    seqs = [
        _seq_with(SamplingParams(frequency_penalty=1.0), [1], [2, 2]),
        _seq_with(SamplingParams(), [1], [2, 2]),
    ]
    got = process_logits(logits, seqs)
    assert torch.equal(got[1], logits[1]) and not torch.equal(got[0], logits[0])


def test_logit_bias_steers_greedy_and_logprobs_follow_it():
    logits = torch.zeros(1, 8)
    logits[0, 2] = 5.0
    params = SamplingParams(temperature=0, logit_bias={6: 100.0})
    tokens, logprobs, _ = Sampler()(logits, [_seq_with(params, [1], [])])
    assert tokens == [6]
    biased = logits.clone()
    biased[0, 6] += 100
    assert logprobs[0] == pytest.approx(torch.log_softmax(biased, -1)[0, 6].item())


def test_min_tokens_masks_eos_and_stop_tokens_until_reached():
    logits = torch.zeros(2, 8)
    logits[:, 0] = 10.0  # eos
    logits[:, 5] = 9.0  # a stop token id
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    early = _seq_with(params, [1], [3])
    late = _seq_with(params, [1], [3, 3])
    tokens, _, _ = Sampler()(logits, [early, late])
    assert tokens[0] not in (0, 5) and tokens[1] == 0


def _greedy_seqs(n: int, **params) -> list[ScheduledSequence]:
    return _seqs(*[SamplingParams(temperature=0, **params)] * n)


def test_sampler_gives_the_same_greedy_result_on_either_path():
    # bf16 logits, as the model returns them: plain greedy rows take the one-pass kernel;
    # asking for top logprobs takes the general fp32 path.
    logits = (4 * torch.randn(6, 3000, generator=torch.Generator().manual_seed(3))).bfloat16()
    fast = Sampler()(logits, _greedy_seqs(6))
    general = Sampler()(logits, _greedy_seqs(6, logprobs=1))
    assert fast[0] == general[0] and fast[2] == [None] * 6
    torch.testing.assert_close(torch.tensor(fast[1]), torch.tensor(general[1]))
    assert all(top is not None for top in general[2])


def test_sampler_applies_logit_bias_before_a_greedy_pick():
    logits = (4 * torch.randn(2, 100, generator=torch.Generator().manual_seed(4))).bfloat16()
    low = int(logits[0].float().argmin())
    seqs = _seqs(SamplingParams(temperature=0, logit_bias={low: 100.0}))
    seqs += _greedy_seqs(1)
    tokens, _, _ = Sampler()(logits, seqs)
    assert tokens == [low, int(logits[1].float().argmax())]


@pytest.mark.cuda
def test_random_and_greedy_rows_sample_on_the_gpu():
    # The noise comes from CPU generators; it must meet the logits on their device.
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(5)).cuda()
    params = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=0.7)]
    params.append(SamplingParams(temperature=0))
    tokens, logprobs, _ = Sampler()(logits, _seqs(*params))
    assert all(0 <= t < 50 for t in tokens) and tokens[2] == int(logits[2].argmax())
    again, _, _ = Sampler()(logits, _seqs(*params))
    assert again[0] == tokens[0]  # seeded
