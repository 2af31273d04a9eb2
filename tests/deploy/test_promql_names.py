"""The PromQL name extractor the metric checks rely on."""

from __future__ import annotations

import pytest

from tests.deploy.tools import promql_metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum(vllm:num_requests_running{model_name=~"$m"})', {"vllm:num_requests_running"}),
        (
            "histogram_quantile(0.99, sum by (le, instance) "
            '(rate(vllm:time_to_first_token_seconds_bucket{a="b"}[$__rate_interval])))',
            {"vllm:time_to_first_token_seconds_bucket"},
        ),
        (
            "max by (job) (a_total + b) > 0 and on (job) max(rate(c[5m])) == 0",
            {"a_total", "b", "c"},
        ),
        ('count(up{job="x", y=~"a|b"} == 0) or vector(0)', {"up"}),
        ("sum(rate(x[5m] offset 1h)) / sum(rate(y[5m]))", {"x", "y"}),
    ],
)
def test_names(expr: str, names: set[str]) -> None:
    assert promql_metric_names(expr) == names
