"""The sampler on known logits, through the metadata the runner builds: greedy,
truncation, seeds, logprobs only where asked (and of tokens picked elsewhere),
penalties and bias, and the sampled distribution. Each test runs with the torch
reference and with the C++ kernel."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hetero_infer.engine.core.sequence import Sequence
from hetero_infer.engine.core.step_data import ScheduledSequence
from hetero_infer.engine.core.step_records import schedule_entry
from hetero_infer.engine.params.sampling_params import SamplingParams
from hetero_infer.engine.worker.randomness import Randomness
from hetero_infer.engine.worker.sampler import Sampler
from hetero_infer.engine.worker.sampling_metadata import SamplingMetadata
from hetero_infer.kernels import select_kernels
from hetero_infer.kernels.greedy import greedy_pick_ref
from hetero_infer.kernels.philox import uniforms_ref
from hetero_infer.kernels.sampling import process_logits_ref, sample_ref

CPU = torch.device("cpu")
_OPS = select_kernels("auto", CPU).ops


@pytest.fixture(params=["reference", "kernel"])
def sampler(request) -> Sampler:
    if request.param == "reference":
        return Sampler(sample_ref, greedy_pick_ref)
    return Sampler(_OPS.sample, _OPS.greedy_pick)


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


def _sample(
    sampler: Sampler,
    logits: torch.Tensor,
    rows: list[ScheduledSequence],
    randomness: Randomness | None = None,
):
    randomness = randomness or Randomness(0, uniforms_ref)
    meta = SamplingMetadata.build(rows, logits.shape[-1], CPU, randomness)
    return sampler(logits, meta)


def _drawn(sampler: Sampler, logits: torch.Tensor, params: SamplingParams, draws: int) -> set:
    """The tokens a one-row batch of ``params`` draws in ``draws`` steps."""
    randomness = Randomness(0, uniforms_ref)
    rows = [_row("a", params, [1], [])]
    return {_sample(sampler, logits, rows, randomness)[0][0] for _ in range(draws)}


def test_greedy_picks_argmax_and_reports_logprobs_only_where_asked(sampler):
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, -1.0]])
    plain = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0))
    tokens, _, tops = _sample(sampler, logits, plain)
    assert tokens == [1, 0] and tops == [None, None]
    asked = _seqs(SamplingParams(temperature=0, logprobs=0), SamplingParams(temperature=0))
    tokens, logprobs, tops = _sample(sampler, logits, asked)
    assert tokens == [1, 0]
    expected = torch.log_softmax(logits, -1)[0, 1].item()
    assert logprobs[0] == pytest.approx(expected) and math.isnan(logprobs[1])
    assert tops == [{1: logprobs[0]}, None]


def test_chosen_logprob_is_the_same_whether_or_not_top_logprobs_are_asked(sampler):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    some = [SamplingParams(temperature=0, logprobs=0), SamplingParams(temperature=0.8, seed=3)]
    more = [SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=0.8, seed=3)]
    tokens, logprobs, tops = _sample(sampler, logits, _seqs(*some * 2))
    tokens_more, logprobs_more, tops_more = _sample(sampler, logits, _seqs(*more * 2))
    assert tokens == tokens_more
    expected = torch.log_softmax(logits, -1)[range(4), tokens]
    for i in (0, 2):
        assert logprobs[i] == pytest.approx(expected[i].item(), abs=1e-5)
        assert logprobs_more[i] == logprobs[i]
        # greedy: the chosen token is the best of the two
        assert len(tops_more[i]) == 2 and tops[i] == {tokens[i]: logprobs[i]}
    assert math.isnan(logprobs[1]) and tops[1] is None and tops_more[1] is None


def test_truncation_to_one_token_is_greedy(sampler):
    logits = torch.randn(4, 50)
    seqs = _seqs(
        SamplingParams(top_k=1),
        SamplingParams(top_p=1e-6),
        SamplingParams(min_p=1.0),
        SamplingParams(temperature=1e-7),
    )
    tokens, _, _ = _sample(sampler, logits, seqs)
    assert tokens == logits.argmax(-1).tolist()


def test_top_k_beyond_the_vocab_keeps_everything(sampler):
    seen = _drawn(sampler, torch.zeros(1, 10), SamplingParams(top_k=2**40), 200)
    assert seen == set(range(10))


def test_seeded_rows_do_not_depend_on_the_batch(sampler):
    torch.manual_seed(0)
    logits = torch.randn(3, 100)
    seeded = SamplingParams(temperature=1.0, seed=42)

    def draws(batch_logits, params_list, column):
        randomness = Randomness(123, uniforms_ref)
        out = []
        for position in range(20):
            rows = [dataclasses.replace(r, start=position) for r in _seqs(*params_list)]
            out.append(_sample(sampler, batch_logits, rows, randomness)[0][column])
        return out

    alone = draws(logits[:1], [seeded], 0)
    crowded = draws(logits[[1, 0, 2]], [SamplingParams(), seeded, SamplingParams()], 1)
    assert alone == crowded and len(set(alone)) > 1


def test_unseeded_rows_repeat_with_the_engine_seed_and_differ_without(sampler):
    logits = torch.zeros(4, 1000)
    rows = _seqs(*[SamplingParams()] * 4)

    def run(seed: int) -> list[list[int]]:
        randomness = Randomness(seed, uniforms_ref)
        return [_sample(sampler, logits, rows, randomness)[0] for _ in range(3)]

    assert run(7) == run(7) != run(8)
    assert len({t for step in run(7) for t in step}) > 8


def test_sampled_frequencies_follow_temperature_softmax(sampler):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    (row,) = _seqs(SamplingParams(temperature=0.7, seed=0))
    counts = torch.zeros(4)
    n = 4000
    randomness = Randomness(0, uniforms_ref)
    for position in range(n):
        # A seeded request draws each position's uniform from (seed, position).
        at_position = dataclasses.replace(row, start=position)
        counts[_sample(sampler, logits, [at_position], randomness)[0][0]] += 1
    expected = torch.softmax(logits[0] / 0.7, -1)
    assert torch.allclose(counts / n, expected, atol=0.03)


# ---- logit bias, min_tokens, penalties: against a plain per-token reference ----


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


PENALTY_CASES = [
    SamplingParams(presence_penalty=1.5),
    SamplingParams(frequency_penalty=0.7),
    SamplingParams(presence_penalty=-0.5, frequency_penalty=-2.0),
    SamplingParams(repetition_penalty=1.3),
    SamplingParams(repetition_penalty=0.8, frequency_penalty=0.3, presence_penalty=0.4),
    SamplingParams(logit_bias={3: 5.0, 7: -100.0}),
    SamplingParams(logit_bias={1: -2.5}, repetition_penalty=1.5, presence_penalty=2.0),
]
HISTORIES = [([1, 2, 3], [4, 4, 5, 1]), ([9], []), ([0, 0], [7, 7, 7, 8, 3])]


@pytest.mark.parametrize("params", PENALTY_CASES)
def test_penalties_and_bias_match_the_reference(params):
    torch.manual_seed(0)
    logits = torch.randn(3, 10) * 3
    seqs = [_row("r", params, p, o) for p, o in HISTORIES]
    meta = SamplingMetadata.build(seqs, 10, CPU, None)
    got = process_logits_ref(logits, meta.tensors)
    for row, (prompt, output) in enumerate(HISTORIES):
        expected = _reference(logits[row].tolist(), params, prompt, output)
        torch.testing.assert_close(got[row], torch.tensor(expected))


@pytest.mark.parametrize("params", PENALTY_CASES)
def test_the_kernel_picks_what_the_processed_logits_say(params):
    # Greedy with logprobs: the pick and its logprob are the processed logits' argmax
    # and log-softmax, whatever was applied to get them.
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1)) * 3
    greedy = dataclasses.replace(params, temperature=0.0, logprobs=0)
    seqs = [_row("r", greedy, p, o) for p, o in HISTORIES]
    meta = SamplingMetadata.build(seqs, 10, CPU, None)
    processed = process_logits_ref(logits, meta.tensors)
    tokens, logprobs, _ = Sampler(_OPS.sample)(logits, meta)
    assert tokens == processed.argmax(-1).tolist()
    expected = torch.log_softmax(processed, -1)[range(3), tokens]
    torch.testing.assert_close(torch.tensor(logprobs), expected)


def test_rows_without_penalties_are_untouched_beside_penalized_ones():
    logits = torch.randn(2, 10)
    seqs = [
        _row("a", SamplingParams(frequency_penalty=1.0), [1], [2, 2]),
        _row("b", SamplingParams(), [1], [2, 2]),
    ]
    got = process_logits_ref(logits, SamplingMetadata.build(seqs, 10, CPU, None).tensors)
    assert torch.equal(got[1], logits[1]) and not torch.equal(got[0], logits[0])


def test_logit_bias_steers_greedy_and_logprobs_follow_it(sampler):
    logits = torch.zeros(1, 8)
    logits[0, 2] = 5.0
    params = SamplingParams(temperature=0, logit_bias={6: 100.0}, logprobs=0)
    tokens, logprobs, _ = _sample(sampler, logits, [_row("r", params, [1], [])])
    assert tokens == [6]
    biased = logits.clone()
    biased[0, 6] += 100
    assert logprobs[0] == pytest.approx(torch.log_softmax(biased, -1)[0, 6].item())


def test_min_tokens_masks_eos_and_stop_tokens_until_reached(sampler):
    logits = torch.zeros(2, 8)
    logits[:, 0] = 10.0  # eos
    logits[:, 5] = 9.0  # a stop token id
    params = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    early = _row("a", params, [1], [3])
    late = _row("b", params, [1], [3, 3])
    tokens, _, _ = _sample(sampler, logits, [early, late])
    assert tokens[0] not in (0, 5) and tokens[1] == 0


def test_banned_tokens_are_never_drawn(sampler):
    logits = torch.zeros(1, 4)
    logits[0, 0] = 3.0  # eos: the likeliest
    params = SamplingParams(temperature=1.0, min_tokens=5)
    assert _drawn(sampler, logits, params, 301) == {1, 2, 3}


def test_allowed_token_ids_are_the_only_ones_drawn(sampler):
    """Several in one 32-token word of the mask, and the word's sign bit (token 31)."""
    allowed = [3, 5, 31, 33]
    params = SamplingParams(temperature=1.0, allowed_token_ids=allowed)
    assert _drawn(sampler, torch.zeros(1, 40), params, 200) == set(allowed)


def test_sampler_gives_the_same_greedy_result_on_either_path(sampler):
    # bf16 logits, as the model returns them: plain greedy rows take the one-pass kernel;
    # asking for top logprobs takes the general path.
    logits = (4 * torch.randn(6, 3000, generator=torch.Generator().manual_seed(3))).bfloat16()
    greedy = SamplingParams(temperature=0)
    fast = _sample(sampler, logits, _seqs(*[greedy] * 6))
    general = _sample(sampler, logits, _seqs(*[dataclasses.replace(greedy, logprobs=1)] * 6))
    assert fast[0] == general[0] and fast[2] == [None] * 6
    assert all(math.isnan(value) for value in fast[1])  # not asked: not computed
    expected = torch.log_softmax(logits.float(), -1)[range(6), general[0]]
    torch.testing.assert_close(torch.tensor(general[1]), expected)
    assert all(top is not None and len(top) <= 2 for top in general[2])


def test_sampler_applies_logit_bias_before_a_greedy_pick(sampler):
    logits = (4 * torch.randn(2, 100, generator=torch.Generator().manual_seed(4))).bfloat16()
    low = int(logits[0].float().argmin())
    seqs = _seqs(
        SamplingParams(temperature=0, logit_bias={low: 100.0}), SamplingParams(temperature=0)
    )
    tokens, _, _ = _sample(sampler, logits, seqs)
    assert tokens == [low, int(logits[1].float().argmax())]


def test_probabilities_are_the_truncated_distribution():
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    rows = _seqs(SamplingParams(temperature=0.5, top_k=3, top_p=0.95))
    meta = SamplingMetadata.build(rows, 5, CPU, None)
    probs = Sampler().probabilities(logits, meta)[0]
    # top-k keeps [6, 4, 2] / 1 (after temperature): 0.867, 0.117, 0.016; the third has
    # 0.984 > 0.95 above it, so top-p drops it.
    expected = torch.softmax(torch.tensor([6.0, 4.0]), -1)
    torch.testing.assert_close(probs, torch.cat([expected, torch.zeros(3)]))


@pytest.mark.cuda
def test_random_and_greedy_rows_sample_on_the_gpu():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(5)).cuda()
    params = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=0.7)]
    params.append(SamplingParams(temperature=0))
    rows = _seqs(*params)
    ops = select_kernels("auto", torch.device("cuda")).ops

    def run():
        meta = SamplingMetadata.build(rows, 50, logits.device, Randomness(0, ops.uniforms))
        return Sampler(ops.sample, ops.greedy_pick)(logits, meta)[0]

    tokens = run()
    assert all(0 <= t < 50 for t in tokens) and tokens[2] == int(logits[2].argmax())
    assert run() == tokens


def test_probabilities_are_each_rows_own_and_only_of_random_rows():
    logits = torch.tensor([[3.0, 2.0, 1.0], [0.0, 0.0, 2.0]])
    random = SamplingParams(temperature=1.0)
    meta = SamplingMetadata.build(_seqs(random, random), 3, CPU, None)
    torch.testing.assert_close(Sampler().probabilities(logits, meta), torch.softmax(logits, -1))
    mixed = SamplingMetadata.build(_seqs(random, SamplingParams(temperature=0)), 3, CPU, None)
    with pytest.raises(AssertionError, match="greedy rows"):
        Sampler().probabilities(logits, mixed)


def test_each_row_gets_as_many_top_logprobs_as_it_asked(sampler):
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(5))
    rows = _seqs(
        SamplingParams(temperature=0, logprobs=1), SamplingParams(temperature=0, logprobs=3)
    )
    _, _, tops = _sample(sampler, logits, rows)
    # A greedy row's token is its best: one of the k.
    assert [len(top) for top in tops] == [1, 3]


def test_logprobs_of_tokens_picked_elsewhere_are_the_samplers(sampler):
    """What speculative decoding reports for the tokens rejection sampling keeps: the
    logprobs the sampler would have reported had it picked them."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(6))
    rows = _seqs(
        SamplingParams(temperature=0, logprobs=2, logit_bias={7: 5.0}),
        SamplingParams(temperature=0.8, seed=1, logprobs=0),
        SamplingParams(temperature=0.8, seed=2, logprobs=3, presence_penalty=1.0),
    )
    tokens, logprobs, tops = _sample(sampler, logits, rows)
    meta = SamplingMetadata.build(rows, 50, CPU, None)
    chosen, tops_of = Sampler().logprobs_of(logits, meta, tokens)
    assert chosen == pytest.approx(logprobs, abs=1e-5)
    assert [set(top) for top in tops_of] == [set(top) for top in tops]
    others = [3, 9, 11]
    chosen, tops_of = Sampler().logprobs_of(logits, meta, others)
    processed = process_logits_ref(logits, meta.tensors).log_softmax(-1)
    assert chosen == pytest.approx(processed[range(3), others].tolist(), abs=1e-5)
    assert [top[t] for top, t in zip(tops_of, others, strict=True)] == chosen


def test_top_k_keeps_the_k_best(sampler):
    logits = torch.zeros(1, 10)
    logits[0, [3, 8]] = 0.5
    assert _drawn(sampler, logits, SamplingParams(top_k=2), 100) == {3, 8}


def test_a_random_row_beside_a_greedy_one_is_drawn(sampler):
    """A batch of plain rows, one greedy: the random one is still drawn, not argmaxed."""
    logits = torch.zeros(2, 10)
    logits[:, 4] = 0.5
    randomness = Randomness(0, uniforms_ref)
    rows = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=1.0))
    drawn = [_sample(sampler, logits, rows, randomness)[0] for _ in range(50)]
    assert {greedy for greedy, _ in drawn} == {4}
    assert len({random for _, random in drawn}) > 3


def test_a_greedy_row_picks_among_its_allowed_tokens(sampler):
    logits = torch.tensor([[0.0, 5.0, 1.0, 2.0]])
    rows = _seqs(SamplingParams(temperature=0, allowed_token_ids=[0, 2]))
    assert _sample(sampler, logits, rows)[0] == [2]


def test_a_forced_token_is_taken_greedy_or_not(sampler):
    """A thinking budget spent forces its end mark (step_records sets it per row)."""
    logits = torch.randn(2, 40, generator=torch.Generator().manual_seed(7))
    rows = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=1.0))
    for row in rows:
        row.forced_token_id = 33
    assert _sample(sampler, logits, rows)[0] == [33, 33]


def test_only_plain_greedy_rows_take_the_one_pass_kernel():
    rows = _seqs(SamplingParams(temperature=0), SamplingParams(temperature=0))
    assert SamplingMetadata.build(rows, 40, CPU, None).tensors is None
    rows[1].forced_token_id = 3
    assert SamplingMetadata.build(rows, 40, CPU, None).tensors is not None
