"""The Prometheus configuration and alert rules, checked by promtool (Prometheus' own
checker): config and rules syntax, and unit tests of every alert (alerts_test.yml)."""

from __future__ import annotations

import yaml

from tests.deploy.tools import PROMETHEUS, REPO_ROOT, require_tool, run_tool


def test_promtool_check_config() -> None:
    # Also checks the rule files the config names (alerts.yml).
    run_tool(require_tool("promtool"), "check", "config", "prometheus.yml", cwd=PROMETHEUS)


def test_promtool_check_rules() -> None:
    out = run_tool(require_tool("promtool"), "check", "rules", "alerts.yml", cwd=PROMETHEUS)
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules() -> None:
    """Each alert fires on the series it should and stays quiet on the others."""
    run_tool(require_tool("promtool"), "test", "rules", "alerts_test.yml", cwd=PROMETHEUS)


def test_every_alert_has_a_unit_test() -> None:
    rules = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((PROMETHEUS / "alerts_test.yml").read_text())
    tested = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert alerts == tested
    # The four the deployment needs: engine dead, queue growing, KV cache full, high TTFT.
    assert {
        "HeteroInferDown",
        "HeteroInferEngineStalled",
        "HeteroInferQueueGrowing",
        "HeteroInferKVCacheNearFull",
        "HeteroInferHighTimeToFirstToken",
    } <= alerts


def test_scrape_target_is_the_compose_server() -> None:
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "hetero-infer"]
    (target,) = job["static_configs"][0]["targets"]
    compose = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    host, port = target.split(":")
    assert host in compose["services"]
    assert f"{port}:{port}" in compose["services"][host]["ports"]
