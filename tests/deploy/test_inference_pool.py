"""deploy/k8s/inference-pool: the Gateway API Inference Extension's InferencePool for
the server's pods, its endpoint picker and the HTTPRoute to it.

kubectl's kustomize renders it; the core objects (the picker's Deployment, Service,
ConfigMap and RBAC) are validated against the Kubernetes API schemas in strict mode,
the InferencePool (inference.networking.k8s.io/v1) and the HTTPRoute against the JSON
Schemas of tests/deploy/inference_schemas.py (no package carries theirs), and the
references between the files, and to the server's Deployment, are checked.
"""

from __future__ import annotations

import copy

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.inference_schemas import SCHEMAS
from tests.deploy.tools import K8S, KUBERNETES_VERSION, VARIANTS, only, render, render_overlay

INFERENCE_POOL = K8S / "inference-pool"
EXPECTED_KINDS = {
    "InferencePool",
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "ConfigMap",
    "Deployment",
    "Service",
    "HTTPRoute",
}


def docs() -> list[dict]:
    return copy.deepcopy(render(INFERENCE_POOL))


def validate(doc: dict) -> None:
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_manifests_validate() -> None:
    rendered = docs()
    assert {doc["kind"] for doc in rendered} == EXPECTED_KINDS
    for doc in rendered:
        validate(doc)


@pytest.mark.parametrize(
    "kind, change",
    [
        (
            "InferencePool",
            lambda d: d["spec"].update(endpointPickerRefs=d["spec"]["endpointPickerRef"]),
        ),
        ("InferencePool", lambda d: d["spec"].pop("targetPorts")),
        ("InferencePool", lambda d: d["spec"]["targetPorts"].append({"number": 70000})),
        ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].pop("port")),
        ("InferencePool", lambda d: d["spec"]["endpointPickerRef"].update(failureMode="Open")),
        ("InferencePool", lambda d: d["spec"]["selector"]["matchLabels"].clear()),
        ("InferencePool", lambda d: d.update(apiVersion="inference.networking.x-k8s.io/v1alpha2")),
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["backendRefs"][0].pop("name")),
        ("HTTPRoute", lambda d: d["spec"]["rules"][0]["timeouts"].update(request="ten minutes")),
        ("HTTPRoute", lambda d: d["spec"]["rules"][0].update(backendRef={})),
    ],
)
def test_the_schemas_refuse_mistakes(kind: str, change) -> None:
    """Each schema catches a misspelt or missing field and a value out of range; an
    apiVersion other than the one targeted finds no schema at all."""
    doc = only(docs(), kind)
    validate(doc)
    change(doc)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.SchemaNotFoundError)):
        validate(doc)


def test_the_picker_takes_the_port_only_for_a_service() -> None:
    pool = only(docs(), "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    del ref["port"]
    ref["kind"] = "Backend"
    ref["group"] = "example.com"
    validate(pool)


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_pool_selects_the_server_pods(variant: str) -> None:
    pool = only(docs(), "InferencePool")["spec"]
    server = only(render_overlay(variant), "Deployment")["spec"]["template"]
    labels = server["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= labels.items()
    (container,) = server["spec"]["containers"]
    ports = {p["containerPort"] for p in container["ports"]}
    assert [p["number"] for p in pool["targetPorts"]] == sorted(ports)


def test_the_picker_serves_this_pool() -> None:
    rendered = docs()
    pool = only(rendered, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    service = only(rendered, "Service")
    deployment = only(rendered, "Deployment")
    pod = deployment["spec"]["template"]
    (epp,) = pod["spec"]["containers"]

    # The pool's picker is this Service, whose ports lead to the picker's container.
    assert (ref["kind"], ref["name"]) == ("Service", service["metadata"]["name"])
    by_name = {p["name"]: p for p in epp["ports"]}
    (grpc,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert by_name[grpc["targetPort"]]["containerPort"] == ref["port"]["number"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(by_name)
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()

    # It is told this pool's name and reads its config from the ConfigMap's key.
    args = epp["args"]
    assert args[args.index("--pool-name") + 1] == pool["metadata"]["name"]
    config_path = args[args.index("--config-file") + 1]
    (mount,) = epp["volumeMounts"]
    (volume,) = pod["spec"]["volumes"]
    assert volume["name"] == mount["name"]
    config_map = only(rendered, "ConfigMap")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    key = config_path.removeprefix(mount["mountPath"] + "/")
    config = yaml.safe_load(config_map["data"][key])
    assert config["kind"] == "EndpointPickerConfig"
    declared = {plugin["type"] for plugin in config["plugins"]}
    for profile in config["schedulingProfiles"]:
        assert {ref["pluginRef"] for ref in profile["plugins"]} <= declared
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= declared
    # The gRPC health service the probes ask for is the picker's.
    for probe in ("livenessProbe", "readinessProbe"):
        assert epp[probe]["grpc"]["port"] == by_name["grpc-health"]["containerPort"]


def test_the_picker_may_read_what_it_watches() -> None:
    rendered = docs()
    pool = only(rendered, "InferencePool")
    account = only(rendered, "ServiceAccount")["metadata"]["name"]
    assert only(rendered, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account
    binding = only(rendered, "RoleBinding")
    role = only(rendered, "Role")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {(s["kind"], s["name"]) for s in binding["subjects"]} == {("ServiceAccount", account)}
    granted = {
        (group, resource)
        for rule in role["rules"]
        if {"get", "list", "watch"} <= set(rule["verbs"])
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    pool_group = pool["apiVersion"].split("/")[0]
    assert {(pool_group, "inferencepools"), ("", "pods")} <= granted


def test_the_route_leads_to_the_pool() -> None:
    rendered = docs()
    pool = only(rendered, "InferencePool")
    route = only(rendered, "HTTPRoute")
    backends = [b for rule in route["spec"]["rules"] for b in rule["backendRefs"]]
    assert backends == [
        {
            "group": pool["apiVersion"].split("/")[0],
            "kind": "InferencePool",
            "name": pool["metadata"]["name"],
        }
    ]
