"""The Kubernetes manifests: rendered by kustomize (kubectl's), validated against the API
schemas of a current Kubernetes release (kubernetes-validate, strict: unknown fields are
errors), the Prometheus Operator's resources against its CRD schemas (cloudcoil's
models generated from them), and the settings that must agree across files."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.deploy.tools import (
    K8S,
    KUBERNETES_VERSION,
    PROMETHEUS,
    VARIANTS,
    only,
    render_overlay,
    require_tool,
    run_tool,
)

# The custom resources (apiVersion, kind), each validated by cloudcoil's model of its CRD,
# named as the kind and imported where a test uses it: importing the models takes
# seconds, which every test process would pay when it collects this file.
CRD_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
EXPECTED_KINDS = {
    "Deployment",
    "Service",
    "HorizontalPodAutoscaler",
    "PodDisruptionBudget",
    "ServiceMonitor",
    "PrometheusRule",
}


def validate_custom_resource(doc: dict) -> None:
    """Validate against the CRD's schema, strictly: a field the model does not know is
    dropped by pydantic, so the round trip would differ."""
    from cloudcoil.models.prometheus_operator import v1 as monitoring_v1

    model = getattr(monitoring_v1, doc["kind"]).model_validate(doc)
    assert model.model_dump(mode="json", by_alias=True, exclude_unset=True) == doc, (
        f"{doc['kind']} has fields its CRD schema does not define"
    )


def validate(doc: dict) -> None:
    if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
        validate_custom_resource(doc)
    else:
        # Raises SchemaNotFoundError for a kind it does not know: no silent skips.
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_overlay_validates(variant: str) -> None:
    docs = render_overlay(variant)
    assert {doc["kind"] for doc in docs} == EXPECTED_KINDS
    for doc in docs:
        validate(doc)


def test_validators_reject_unknown_fields() -> None:
    """The checks above would catch a typo: both validators refuse an unknown field."""
    docs = copy.deepcopy(render_overlay("cpu"))
    deployment = only(docs, "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    del deployment["spec"]["template"]["spec"]["containers"][0]["livenesProbe"]
    monitor = only(docs, "ServiceMonitor")
    monitor["spec"]["endpoints"][0]["intervall"] = "15s"
    with pytest.raises(AssertionError):
        validate_custom_resource(monitor)
    del monitor["spec"]["endpoints"][0]["intervall"]
    monitor["spec"]["endpoints"][0]["interval"] = "fifteen seconds"
    with pytest.raises(ValueError):  # pydantic's ValidationError: the CRD's pattern
        validate_custom_resource(monitor)


def container(docs: list[dict]) -> dict:
    (server,) = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return server


def env_of(server: dict) -> dict[str, dict]:
    return {item["name"]: item for item in server["env"]}


def seconds(duration: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)(ms|s|m|h)", duration))


@pytest.mark.parametrize("variant", VARIANTS)
def test_deployment(variant: str) -> None:
    docs = render_overlay(variant)
    deployment = only(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    server = container(docs)
    env = env_of(server)

    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    security = server["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # Writable mounts where the server writes: home, HF_HOME (the image's), /tmp.
    volumes = {v["name"] for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in server["volumeMounts"]}
    assert set(mounts.values()) <= volumes
    assert {"/home/app", "/home/app/.cache/huggingface", "/tmp"} <= set(mounts)

    # Probes: startup on /readyz long enough for a model load, then liveness and readiness.
    port = int(env["HETERO_PORT"]["value"])
    (http_port,) = server["ports"]
    assert http_port["containerPort"] == port and http_port["name"] == "http"
    startup, liveness, readiness = (
        server[p] for p in ("startupProbe", "livenessProbe", "readinessProbe")
    )
    assert startup["httpGet"]["path"] == "/readyz"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert liveness["httpGet"]["path"] == "/healthz"
    assert readiness["httpGet"]["path"] == "/readyz"
    for probe in (startup, liveness, readiness):
        assert probe["httpGet"]["port"] == "http"

    # Drain: the grace period covers the preStop pause and the server's shutdown timeout.
    pause = server["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = float(env["HETERO_SHUTDOWN_TIMEOUT"]["value"])
    assert pod["terminationGracePeriodSeconds"] >= pause + drain + 5

    # The API key comes from a Secret, never a literal.
    assert "value" not in env["HETERO_API_KEY"]
    assert env["HETERO_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "hetero-infer-api-key"

    resources = server["resources"]
    for key in ("cpu", "memory"):
        assert key in resources["requests"] and key in resources["limits"]
    image_name, tag = server["image"].rsplit(":", 1)
    if variant == "gpu":
        assert tag == "cuda"
        assert resources["limits"]["nvidia.com/gpu"] == "1"
        assert env["HETERO_DEVICE"]["value"] == "cuda"
        assert any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    else:
        assert tag == "cpu"
        assert "nvidia.com/gpu" not in resources["limits"]
        assert "HETERO_DEVICE" not in env


@pytest.mark.parametrize("variant", VARIANTS)
def test_selectors_and_references_agree(variant: str) -> None:
    docs = render_overlay(variant)
    deployment = only(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = only(docs, "Service")
    monitor = only(docs, "ServiceMonitor")
    hpa = only(docs, "HorizontalPodAutoscaler")
    pdb = only(docs, "PodDisruptionBudget")

    def selects(selector: dict, labels: dict) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    assert selects(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(service["spec"]["selector"], pod_labels)
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
    # The alert rules select job="hetero-infer": the ServiceMonitor's job is the Service's name.
    assert service["metadata"]["name"] == "hetero-infer"

    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"


def test_hpa_metric_comes_from_the_prometheus_adapter() -> None:
    """The HPA's metric is the one the adapter's rule serves, made from the waiting gauge."""
    hpa = only(render_overlay("cpu"), "HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    values = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    (rule,) = values["rules"]["custom"]
    assert rule["name"]["as"] == metric["pods"]["metric"]["name"]
    assert rule["seriesQuery"].startswith("vllm:num_requests_waiting{")
    assert re.fullmatch(rule["name"]["matches"], "vllm:num_requests_waiting")


def test_prometheus_rule_is_the_alert_rules_file(tmp_path: Path) -> None:
    """One set of alert rules: the PrometheusRule's groups are alerts.yml's, and promtool
    accepts them as they are deployed."""
    alerts = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for variant in VARIANTS:
        rule = only(render_overlay(variant), "PrometheusRule")
        assert rule["spec"] == alerts, (
            "deploy/k8s/base/prometheusrule.yaml's spec must be deploy/prometheus/alerts.yml:"
            " copy the groups over"
        )
    extracted = tmp_path / "prometheusrule-groups.yml"
    extracted.write_text(yaml.safe_dump(rule["spec"]))
    run_tool(require_tool("promtool"), "check", "rules", str(extracted))
