"""Where the engine's random draws come from (engine/worker/randomness.py): a seeded
request's draw is Philox at its seed, position and purpose; draws of different
purposes, and an unseeded request's beside a seeded one's, never share a uniform."""

from __future__ import annotations

import pytest
from hetero_infer.engine.worker.randomness import (
    ACCEPT_STREAM,
    DRAFT_STREAM,
    RESIDUAL_STREAM,
    SAMPLE_STREAM,
    Randomness,
)
from hetero_infer.kernels.philox import uniform, uniforms_ref

STREAMS = [SAMPLE_STREAM, DRAFT_STREAM, ACCEPT_STREAM, RESIDUAL_STREAM]


def test_a_seeded_draw_is_philox_at_its_seed_position_and_stream():
    randomness = Randomness(0, uniforms_ref)
    for seed in [0, 5, 42, 2**63 - 1]:
        assert randomness.uniform(seed, 3, DRAFT_STREAM) == uniform(seed, 3, DRAFT_STREAM)


def test_a_seed_is_its_64_bits():
    """Seeds outside int64 (OpenAI's seed is any integer) keep their low 64 bits."""
    randomness = Randomness(0, uniforms_ref)
    for seed in [-1, 2**63, 2**64 - 1, 2**64 + 5, -(2**63)]:
        assert randomness.uniform(seed, 3, SAMPLE_STREAM) == uniform(seed % 2**64, 3, SAMPLE_STREAM)


def test_each_purpose_draws_its_own_uniform_at_a_position():
    randomness = Randomness(0, uniforms_ref)
    assert len({randomness.uniform(42, 5, stream) for stream in STREAMS}) == len(STREAMS)
    unseeded = {Randomness(42, uniforms_ref).uniform(None, 5, stream) for stream in STREAMS}
    assert len(unseeded) == len(STREAMS)


def test_unseeded_draws_follow_the_engines_count_apart_from_seeded_ones():
    """The n-th unseeded draw of an engine seeded 7 is not a request's seeded 7 at
    position n, and the count moves on with each draw whatever the position."""
    unseeded = Randomness(7, uniforms_ref).uniforms([None] * 3, [0, 0, 0], SAMPLE_STREAM)
    seeded = Randomness(7, uniforms_ref).uniforms([7] * 3, [0, 1, 2], SAMPLE_STREAM)
    assert len(set(unseeded.tolist())) == 3
    assert not set(unseeded.tolist()) & set(seeded.tolist())
    again = Randomness(7, uniforms_ref).uniforms([None] * 3, [9, 9, 9], SAMPLE_STREAM)
    assert again.tolist() == unseeded.tolist()


def test_a_row_without_a_position_is_refused():
    with pytest.raises(ValueError):
        Randomness(0, uniforms_ref).uniforms([1, 2], [0], SAMPLE_STREAM)
