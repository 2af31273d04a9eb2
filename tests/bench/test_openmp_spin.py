"""bench.openmp_spin's summary, on made-up rates."""

from __future__ import annotations

import pytest

from bench.openmp_spin import _spin_counts, summarize


def test_each_count_is_compared_with_the_default():
    summary = summarize({0: [300.0, 100.0, 200.0], 10_000: [400.0, 500.0]}, default=10_000)
    assert summary["0"]["median_output_tok_s"] == 200.0
    assert summary["0"]["over_default"] == pytest.approx(200.0 / 450.0)
    assert summary["10000"]["over_default"] == 1.0


def test_without_the_default_there_is_no_ratio():
    assert summarize({0: [1.0]}, default=10_000)["0"]["over_default"] is None


def test_a_count_of_zero_is_accepted():
    assert _spin_counts("0,10000,") == [0, 10_000]
