"""The Grafana dashboard and provisioning: the JSON loads, it covers what an operator
needs, promtool parses every query, and every metric a query (or an alert rule, or the
autoscaler's adapter rule) names is one a live server really exports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.tools import (
    DASHBOARD,
    GRAFANA,
    K8S,
    PROMETHEUS,
    REPO_ROOT,
    promql_metric_names,
    require_tool,
    run_tool,
)
from tests.server.conftest import start_server
from tests.tiny_models import save_tiny_model

# Series Prometheus makes itself, not the server.
SYNTHETIC = {"up"}
# Grafana's variables, replaced by what they expand to, for promtool.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$model_name": ".*"}


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panel_queries() -> Iterator[tuple[str, str]]:
    for panel in load_dashboard()["panels"]:
        for target in panel["targets"]:
            yield panel["title"], target["expr"]


def variable_queries() -> Iterator[str]:
    """The metric each templating query reads: label_values(METRIC, LABEL)."""
    for variable in load_dashboard()["templating"]["list"]:
        query = variable["query"]["query"]
        assert query.startswith("label_values(") and query.endswith(")")
        yield query[len("label_values(") : -1].split(",")[0].strip()


def test_dashboard_loads_and_covers_the_operator_view() -> None:
    dashboard = load_dashboard()
    assert dashboard["uid"] == "hetero-infer"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "prometheus"
        for target in panel["targets"]:
            assert target["expr"].strip()
    read = {name for _, expr in panel_queries() for name in promql_metric_names(expr)}
    for metric in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
    ):
        assert metric in read, f"no panel shows {metric}"
    exprs = [expr for _, expr in panel_queries()]
    for quantile in ("0.5", "0.99"):
        for metric in ("time_to_first_token", "inter_token_latency", "e2e_request_latency"):
            assert any(f"histogram_quantile({quantile}, " in e and metric in e for e in exprs)


def test_provisioning_points_at_the_dashboard_and_data_source() -> None:
    datasources = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (source,) = datasources["datasources"]
    assert (source["type"], source["uid"]) == ("prometheus", "prometheus")
    providers = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "hetero-infer.yml").read_text()
    )
    (provider,) = providers["providers"]
    # docker-compose.yml mounts deploy/grafana/dashboards there.
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    assert f"./deploy/grafana/dashboards:{provider['options']['path']}:ro" in mounts


def test_promtool_parses_every_query(tmp_path: Path) -> None:
    """Each panel query, with Grafana's variables expanded, as a recording rule: promtool
    check rules runs Prometheus' own PromQL parser over them."""
    rules = []
    for i, (_, expr) in enumerate(panel_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_tool(require_tool("promtool"), "check", "rules", str(path))


@pytest.fixture(scope="module")
def exported_names(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The sample names a live server (real engine, tiny model) exports after it has
    served a request, so that histograms and per-reason counters have children.

    The server has an API key, as in Kubernetes: Prometheus scrapes without one."""
    model_dir = save_tiny_model("llama", tmp_path_factory.mktemp("tiny-llama"))
    live = start_server(model_dir, api_key="deploy-test-key")
    try:
        with live.client() as client:
            body = {"model": live.settings.model_name, "prompt": "Hello", "max_tokens": 4}
            auth = {"Authorization": "Bearer deploy-test-key"}
            assert client.post("/v1/completions", json=body, headers=auth).status_code == 200
            scrape = client.get("/metrics")
            assert scrape.status_code == 200
            text = scrape.text
    finally:
        live.stop()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def test_dashboard_queries_name_exported_metrics(exported_names: set[str]) -> None:
    for title, expr in panel_queries():
        names = promql_metric_names(expr)
        assert names, f"{title}: {expr} reads no metric"
        missing = names - exported_names - SYNTHETIC
        assert not missing, f"panel {title!r} reads {missing}, which the server does not export"
    for metric in variable_queries():
        assert metric in exported_names


def test_alert_rules_name_exported_metrics(exported_names: set[str]) -> None:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            missing = promql_metric_names(rule["expr"]) - exported_names - SYNTHETIC
            assert not missing, f"{rule['alert']} reads {missing}"


def test_autoscaler_metric_is_exported(exported_names: set[str]) -> None:
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    for rule in values["rules"]["custom"]:
        assert promql_metric_names(rule["seriesQuery"]) <= exported_names
