"""The batched sampler: its definition on hand-made rows, Philox against its published
answers, and the C++ kernel (as the engine selects it on the CPU) against the torch
reference on random batches with every feature, at 1, 2 and 4 threads."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Collection

import pytest
import torch
from hetero_infer.kernels import select_kernels
from hetero_infer.kernels.cpu_extension import load_cpu_kernels
from hetero_infer.kernels.philox import philox4x32, uniforms_ref
from hetero_infer.kernels.sampling import (
    SamplingTensors,
    draw_ref,
    process_logits_ref,
    sample_ref,
    truncated_weights_ref,
)

from tests.kernels.checks import refusals, strided

OPS = select_kernels("auto", torch.device("cpu")).ops


def chi_square_p(observed: list[float], expected: list[float]) -> float:
    """Pearson's chi-square test's p-value (the survival function of chi2 with
    len - 1 degrees of freedom is the regularised upper incomplete gamma)."""
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))


def one_row(top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, temperature: float = 1.0):
    """[1] tensors of one row's truncation parameters."""
    return (
        torch.tensor([temperature]),
        torch.tensor([top_k]),
        torch.tensor([top_p]),
        torch.tensor([min_p]),
    )


# ---- the definition ----


def test_philox_gives_random123s_known_answers():
    # Random123's kat_vectors for philox4x32_10.
    assert philox4x32(0, (0, 0, 0, 0)) == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert philox4x32(2**64 - 1, (2**32 - 1,) * 4) == (
        0x408F276D,
        0x41C83B0E,
        0xA20BC7C6,
        0x6D5451FD,
    )
    counter = (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert philox4x32(0x299F31D0A4093822, counter) == (
        0xD16CFE09,
        0x94FDCCEB,
        0x5001E420,
        0x24126EA1,
    )


def test_the_kernels_philox_is_the_reference():
    assert load_cpu_kernels() is not None
    g = torch.Generator().manual_seed(0)
    keys = torch.randint(-(2**63), 2**63 - 1, (500,), generator=g)
    counters = torch.randint(-(2**63), 2**63 - 1, (500, 2), generator=g)
    uniforms = OPS.uniforms(keys, counters)
    assert torch.equal(uniforms, uniforms_ref(keys, counters))
    assert bool(((uniforms >= 0) & (uniforms < 1)).all()) and uniforms.std() > 0.25


def test_top_k_keeps_ties_at_the_kth_logit():
    logits = torch.tensor([[4.0, 3.0, 3.0, 1.0]])
    weights = truncated_weights_ref(logits, *one_row(top_k=2))
    assert (weights > 0).tolist() == [[True, True, True, False]]


def test_top_p_keeps_a_token_while_the_heavier_ones_weigh_less_than_p():
    # weights 1, e^-1, e^-1, e^-3: normalised 0.56, 0.21, 0.21, 0.03
    logits = torch.tensor([[0.0, -1.0, -1.0, -3.0]])
    kept = lambda p: (truncated_weights_ref(logits, *one_row(top_p=p)) > 0)[0].tolist()  # noqa: E731
    assert kept(0.5) == [True, False, False, False]
    # ties are kept or dropped together: 0.56 < 0.6 keeps both e^-1 tokens
    assert kept(0.6) == [True, True, True, False]
    assert kept(0.985) == [True, True, True, True]


def test_min_p_keeps_tokens_at_least_that_fraction_of_the_heaviest():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.2, 0.05]]))
    weights = truncated_weights_ref(logits, *one_row(min_p=0.35))
    assert (weights > 0).tolist() == [[True, True, True, False]]


def test_the_draw_is_the_inverse_of_the_running_sum():
    weights = torch.tensor([[0.0, 1.0, 0.0, 2.0, 1.0]] * 5)
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 0.7499, 0.9999], dtype=torch.float64)
    assert draw_ref(weights, uniforms).tolist() == [1, 1, 3, 3, 4]


def test_the_draw_never_passes_the_last_kept_token():
    """Where u times the total rounds up to the total (u = 1 here), the running sum is
    reached at the last kept token and stays there over the dropped ones after it."""
    weights = torch.tensor([[1.0, 2.0, 0.0, 0.0]])
    assert draw_ref(weights, torch.tensor([1.0], dtype=torch.float64)).tolist() == [1]


def test_excluded_tokens_stay_out_whatever_the_bias():
    logits = torch.zeros(1, 8)
    tensors = SamplingTensors.build(
        [1.0], [0], [1.0], [0.0], torch.zeros(1, dtype=torch.float64), [False],
        bias=[{3: 100.0}], banned=[{3}],
    )  # fmt: skip
    assert process_logits_ref(logits, tensors)[0, 3] == float("-inf")


# ---- the C++ kernel against the reference ----


# What a row's logits go through before the draw (process_logits_ref).
FEATURES = ("penalties", "bias", "banned", "allowed")


def random_batch(
    rows: int, vocab: int, seed: int, features: Collection[str] = FEATURES
) -> SamplingTensors:
    """Rows that mix greedy and random, every truncation, and ``features`` of FEATURES:
    penalties, bias, banned tokens and grammar masks."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    keys = torch.randint(0, 2**62, (rows,), generator=g)
    uniforms = uniforms_ref(keys, torch.randint(0, 2**40, (rows, 2), generator=g))

    def ids(n: int) -> list[int]:
        return [rng.randrange(vocab) for _ in range(rng.randrange(n))]

    allowed = torch.randint(
        -(2**31), 2**31 - 1, (rows, -(-vocab // 32)), dtype=torch.int32, generator=g
    )
    allowed[::2] = -1  # half the rows unconstrained
    return SamplingTensors.build(
        temperature=[rng.choice([0.0, 0.3, 0.7, 1.0, 1.5]) for _ in range(rows)],
        top_k=[rng.choice([0, 0, 1, 5, 40, 10 * vocab]) for _ in range(rows)],
        top_p=[rng.choice([1.0, 1.0, 0.95, 0.9, 0.5, 0.01]) for _ in range(rows)],
        min_p=[rng.choice([0.0, 0.0, 0.05, 0.5]) for _ in range(rows)],
        uniforms=uniforms,
        wants_logprob=[rng.random() < 0.5 for _ in range(rows)],
        penalties=[
            (rng.choice([0.0, 1.5]), rng.choice([0.0, -1.0, 0.5]), rng.choice([1.0, 1.3, 0.8]))
            for _ in range(rows)
        ]
        if "penalties" in features
        else None,
        prompt_ids=[ids(6) for _ in range(rows)],
        output_ids=[ids(12) for _ in range(rows)],
        bias=[{t: rng.uniform(-100, 100) for t in ids(4)} for _ in range(rows)]
        if "bias" in features
        else None,
        banned=[set(ids(3)) for _ in range(rows)] if "banned" in features else None,
        allowed=allowed.masked_fill_(allowed == 0, 1) if "allowed" in features else None,
    )


def check_same(got: tuple[torch.Tensor, torch.Tensor], ref: tuple[torch.Tensor, torch.Tensor]):
    tokens, logprobs = got
    ref_tokens, ref_logprobs = ref
    # Each side has its own exp: a draw may differ where u falls within rounding of a
    # boundary, which is rare enough that none of these batches has one.
    assert torch.equal(tokens, ref_tokens)
    assert torch.equal(torch.isnan(logprobs), torch.isnan(ref_logprobs))
    torch.testing.assert_close(logprobs, ref_logprobs, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("rows", "vocab", "scale"),
    # 1000: logits spread so far that top-k's floor lies beyond the first margins
    [(64, 3000, 3.0), (8, 49152, 5.0), (33, 517, 0.3), (24, 2000, 1000.0)],
)
@pytest.mark.parametrize("features", [(), FEATURES], ids=["plain", "features"])
def test_kernel_matches_reference(dtype, rows, vocab, scale, features):
    seed = rows * vocab
    logits = scale * torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed))
    tensors = random_batch(rows, vocab, seed, features)
    check_same(OPS.sample(logits.to(dtype), tensors), sample_ref(logits.to(dtype), tensors))


def test_kernel_top_k_keeps_a_kth_logit_that_sits_on_its_floor():
    """The kernel gathers top-k's candidates at or above a floor 2, 4, ..., 64 below the
    row's top (then 1024-fold wider): a row whose k-th logit is exactly on the floor
    keeps it, as the reference does. 40 draws of each row: the k-th token, e^-2 of the
    top's weight where it sits 2 below, is drawn in about a tenth of its row's."""
    vocab, top, k, draws = 64, 10.0, 3, 40
    margins = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 65536.0]
    logits = torch.full((len(margins) * draws, vocab), -1e6)
    for row, margin in enumerate(margins * draws):
        logits[row, [5, 17, 40]] = torch.tensor([top, top - 1, top - margin])
    rows = len(logits)
    generator = torch.Generator().manual_seed(3)
    keys = torch.randint(0, 2**62, (rows,), generator=generator)
    tensors = SamplingTensors.build(
        temperature=[1.0] * rows,
        top_k=[k] * rows,
        top_p=[1.0] * rows,
        min_p=[0.0] * rows,
        uniforms=uniforms_ref(keys, torch.randint(0, 2**40, (rows, 2), generator=generator)),
        wants_logprob=[True] * rows,
    )
    expected = sample_ref(logits, tensors)
    assert 40 in expected[0].tolist()  # the k-th token was drawn
    check_same(OPS.sample(logits, tensors), expected)


@pytest.mark.parametrize("feature", FEATURES)
def test_kernel_matches_reference_with_one_feature(feature):
    """Each feature on its own: the others' absence must not skip it."""
    logits = 3 * torch.randn(12, 700, generator=torch.Generator().manual_seed(5))
    tensors = random_batch(12, 700, 5, [feature])
    check_same(OPS.sample(logits, tensors), sample_ref(logits, tensors))
    assert not torch.equal(process_logits_ref(logits, tensors), logits)  # it changes the rows


def test_kernel_never_draws_an_excluded_token():
    """Two tokens allowed; u up to the top of its range, where the walk ends on the last
    token of any weight: an excluded token's weight is exactly 0."""
    vocab, allowed = 4096, {5, 4000}
    uniforms = torch.tensor([0.0, 0.5, 1 - 1e-12, 1 - 1e-16], dtype=torch.float64)
    rows = len(uniforms)
    banned = set(range(vocab)) - allowed
    tensors = SamplingTensors.build(
        [0.7] * rows, [0] * rows, [1.0] * rows, [0.0] * rows, uniforms, [False] * rows,
        banned=[banned] * rows,
    )  # fmt: skip
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(3))
    tokens, _ = OPS.sample(logits, tensors)
    assert set(tokens.tolist()) <= allowed


DTYPES = {"fp32": torch.float32, "fp64": torch.float64, "int32": torch.int32, "int64": torch.int64}


def sample_arguments(case: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The sampler's arguments for two rows of 64 tokens with every feature, then broken
    as ``case`` says: "<how> <argument>", how being a dtype, a row too many ("3-row"),
    "2-d", "strided", an id list's offsets past its ids ("unended"), an id past the
    vocabulary or below 0 ("past", "negative"), a value short, a mask a word "narrow"
    ("none": left whole)."""
    tensors = SamplingTensors.build(
        temperature=[0.0, 1.0],
        top_k=[0, 5],
        top_p=[1.0, 0.9],
        min_p=[0.0, 0.1],
        uniforms=torch.tensor([0.25, 0.75], dtype=torch.float64),
        wants_logprob=[True, False],
        penalties=[(0.5, 0.5, 1.1), (0.0, 0.0, 1.0)],
        prompt_ids=[[0, 2], [3]],  # token 0 and 63, the vocabulary's ends
        output_ids=[[4], [5, 63]],
        bias=[{7: 1.0}, {8: -1.0}],
        banned=[{9}, {10}],
        allowed=torch.full((2, 2), -1, dtype=torch.int32),
    )
    fields = dict(zip(tensors.__dataclass_fields__, tensors.fields(), strict=True))
    logits = torch.randn(2, 64, generator=torch.Generator().manual_seed(0))
    match case.split(" ", 1):
        case ["1-d", "logits"]:
            logits = logits[0]
        case ["strided", "logits"]:
            logits = strided(logits)
        case ["no", "vocabulary"]:
            logits = logits[:, :0]
        case [dtype, name] if dtype in DTYPES:
            fields[name] = fields[name].to(DTYPES[dtype])
        case ["3-row", name]:
            fields[name] = torch.cat([fields[name], fields[name][:1]])
        case ["2-d", name]:
            fields[name] = fields[name][:, None]
        case ["strided", name]:
            fields[name] = strided(fields[name])
        case ["unended", name]:
            fields[name.replace("ids", "offsets")][-1] += 1
        case ["past", name]:
            fields[name][0] = 64
        case ["negative", name]:
            fields[name][0] = -1
        case ["short", name]:
            fields[name] = fields[name][:-1]
        case ["narrow", name]:
            fields[name] = fields[name][:, :1].contiguous()
        case ["65", "tokens"]:
            logits = torch.randn(2, 65)
    return logits, fields


SAMPLE_REFUSALS = {
    r"logits must be a contiguous \[rows, vocab\]": [
        "1-d logits",
        "strided logits",
        "no vocabulary",
    ],
    **{
        rf"{name}: expected a contiguous \[rows\] tensor": [
            f"{wrong} {name}",
            f"3-row {name}",
            f"2-d {name}",
            f"strided {name}",
        ]
        for name, wrong in [
            ("temperature", "fp64"),
            ("top_k", "int32"),
            ("top_p", "fp64"),
            ("min_p", "fp64"),
            ("uniforms", "fp32"),
            ("wants_logprob", "int32"),
            ("presence", "fp64"),
            ("frequency", "fp64"),
            ("repetition", "fp64"),
        ]
    },
    **{
        rf"{name}: expected a contiguous \[rows\] tensor": [f"int32 {offsets}", f"3-row {offsets}"]
        for name, offsets in [
            ("prompt_ids", "prompt_offsets"),
            ("output_ids", "output_offsets"),
            ("bias_ids", "bias_offsets"),
            ("banned_ids", "banned_offsets"),
        ]
    },
    **{
        rf"{name}: int64 ids": [f"int32 {name}", f"strided {name}"]
        for name in ["prompt_ids", "output_ids", "bias_ids", "banned_ids"]
    },
    **{
        f"{name}: offsets do not end at ids": [f"unended {name}"]
        for name in ["prompt_ids", "output_ids", "bias_ids", "banned_ids"]
    },
    **{
        f"{name}: a token id is outside the vocabulary": [f"past {name}", f"negative {name}"]
        for name in ["prompt_ids", "output_ids", "bias_ids", "banned_ids"]
    },
    "bias_values: one fp32 value per id": ["fp64 bias_values", "short bias_values"],
    r"allowed: a contiguous \[rows, ceil\(vocab / 32\)\] int32 bit mask": [
        "int64 allowed",
        "3-row allowed",
        "strided allowed",
        "narrow allowed",
        "65 tokens",
    ],
}


@pytest.mark.parametrize(("case", "message"), refusals(SAMPLE_REFUSALS))
def test_the_sampler_refuses_what_it_cannot_read(case, message):
    """Every argument's shape, dtype and layout, and the id lists' ends and range; a mask
    of exactly ceil(vocab / 32) words (64 tokens: 2 of them) taken."""
    kernels = load_cpu_kernels()
    logits, fields = sample_arguments("none")
    whole = SamplingTensors(**fields)
    check_same(kernels.sample(logits, *whole.fields()), sample_ref(logits, whole))
    logits, fields = sample_arguments(case)
    with pytest.raises(RuntimeError, match=message):
        kernels.sample(logits, *fields.values())


PHILOX_REFUSALS = {
    r"keys: a contiguous \[n\] int64 tensor": ["int32 keys", "2-d keys", "strided keys"],
    r"counters: a contiguous \[n, 2\] int64 tensor": [
        "int32 counters",
        "1-d counters",
        "3-row counters",
        "3-column counters",
        "strided counters",
    ],
}


@pytest.mark.parametrize(("case", "message"), refusals(PHILOX_REFUSALS))
def test_philox_refuses_what_it_cannot_read(case, message):
    keys, counters = torch.arange(2), torch.zeros(2, 2, dtype=torch.long)
    assert load_cpu_kernels().philox_uniform(keys, counters).shape == (2,)
    match case:
        case "int32 keys":
            keys = keys.int()
        case "2-d keys":
            keys = keys[:, None]
        case "strided keys":
            keys = torch.arange(4)[::2]
        case "int32 counters":
            counters = counters.int()
        case "1-d counters":
            counters = counters.flatten()
        case "3-row counters":
            counters = torch.zeros(3, 2, dtype=torch.long)
        case "3-column counters":
            counters = torch.zeros(2, 3, dtype=torch.long)
        case "strided counters":
            counters = strided(counters)
    with pytest.raises(RuntimeError, match=message):
        load_cpu_kernels().philox_uniform(keys, counters)


def sample_within(seconds: float, logits: torch.Tensor, tensors: SamplingTensors):
    """OPS.sample's answer, failing (not hanging) where it does not end in time: the
    kernel releases the GIL, so a stuck call is left spinning on its thread."""
    answer = []
    thread = threading.Thread(target=lambda: answer.append(OPS.sample(logits, tensors)))
    thread.daemon = True
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the sampler did not end"
    return answer[0]


@pytest.mark.parametrize(
    "truncation",
    [{}, {"top_k": 5}, {"top_p": 0.5}, {"top_k": 5, "top_p": 0.5, "min_p": 0.1}],
    ids=["none", "top-k", "top-p", "all"],
)
def test_kernel_ends_on_logits_that_are_not_finite(truncation):
    """NaN logits (a broken row) and infinite ones (a repetition penalty near 0 divides
    a logit past the largest float): top-k's floor search never ended on them (planted:
    without make_finite, the top-k rows time out). A NaN is never drawn; +inf takes the
    whole mass; a row of NaN still gives a token."""
    vocab = 1000
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(5))
    logits[0, ::3] = float("nan")
    logits[1, 7] = float("inf")
    logits[2] = float("nan")
    logits[3, ::2] = float("-inf")
    logits[4, 9] = float("inf")  # a greedy row
    rows = len(logits)
    tensors = SamplingTensors.build(
        temperature=[0.7] * (rows - 1) + [0.0],
        top_k=[truncation.get("top_k", 0)] * rows,
        top_p=[truncation.get("top_p", 1.0)] * rows,
        min_p=[truncation.get("min_p", 0.0)] * rows,
        uniforms=torch.tensor([0.1, 0.5, 0.9, 0.3, 0.6], dtype=torch.float64),
        wants_logprob=[True] * rows,
    )
    tokens, logprobs = sample_within(20, logits, tensors)
    assert tokens[0] % 3 != 0 and torch.isfinite(logprobs[0])
    assert tokens[1] == 7 and logprobs[1] == 0
    assert 0 <= tokens[2] < vocab
    assert tokens[3] % 2 == 1 and torch.isfinite(logprobs[3])
    assert tokens[4] == 9


def test_kernel_rows_are_the_same_on_any_thread_count():
    logits = 3 * torch.randn(40, 5000, generator=torch.Generator().manual_seed(7))
    tensors = random_batch(40, 5000, 7)
    previous = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 4):
            torch.set_num_threads(threads)
            results.append(OPS.sample(logits, tensors))
    finally:
        torch.set_num_threads(previous)
    for tokens, logprobs in results[1:]:
        assert torch.equal(tokens, results[0][0])
        assert torch.equal(logprobs.nan_to_num(), results[0][1].nan_to_num())


def test_a_row_alone_samples_as_in_a_batch():
    logits = 3 * torch.randn(9, 2000, generator=torch.Generator().manual_seed(8))
    tensors = random_batch(9, 2000, 8)
    whole = OPS.sample(logits, tensors)
    for row in range(9):
        alone = OPS.sample(logits[row : row + 1], tensors.select([row]))
        assert alone[0].item() == whole[0][row].item()


@pytest.mark.parametrize(
    ("top_k", "top_p", "min_p"), [(0, 1.0, 0.0), (3, 1.0, 0.0), (0, 0.8, 0.0), (4, 0.9, 0.1)]
)
def test_kernel_draws_follow_the_truncated_distribution(top_k, top_p, min_p):
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    n = 20_000
    params = one_row(top_k, top_p, min_p, temperature=0.8)
    weights = truncated_weights_ref(logits, *params)[0]
    expected = (weights / weights.sum()).double()
    positions = torch.stack([torch.arange(n), torch.zeros(n, dtype=torch.long)], 1)
    uniforms = OPS.uniforms(torch.full((n,), 12345), positions)
    tensors = SamplingTensors.build(
        [0.8] * n, [top_k] * n, [top_p] * n, [min_p] * n, uniforms, [False] * n
    )
    counts = Counter(OPS.sample(logits.expand(n, -1).contiguous(), tensors)[0].tolist())
    kept = [t for t in range(8) if expected[t] > 0]
    assert set(counts) == set(kept)
    observed = [counts[t] for t in kept]
    assert chi_square_p(observed, [float(expected[t]) * n for t in kept]) > 1e-3
    # The negative control: the untruncated softmax is told apart from these draws.
    if len(kept) < 8:
        full = torch.softmax(logits[0] / 0.8, -1).double()
        with_all = [counts[t] + 0.5 for t in range(8)]  # no zero cells
        assert chi_square_p(with_all, (full * sum(with_all)).tolist()) < 1e-6
