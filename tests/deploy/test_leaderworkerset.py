"""deploy/k8s/leaderworkerset: one engine over the pods of a LeaderWorkerSet group,
tensor-parallel across machines.

kubectl's kustomize renders it; the LeaderWorkerSet (leaderworkerset.x-k8s.io/v1) is
validated against the JSON Schema of tests/deploy/leaderworkerset_schema.py (no package
carries its CRD), its two pod templates and the Service against the Kubernetes API
schemas in strict mode. Each pod's command, with the variables LeaderWorkerSet sets
expanded as the kubelet expands them, is parsed by the server's own parser into the
settings that pod runs with: one engine's settings, node by node.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from hetero_infer.engine.settings.config import EngineConfig
from hetero_infer.engine.settings.dist_init_addr import split_init_addr
from hetero_infer.server.cli import build_serve_parser, server_settings_from_args

from tests.deploy.leaderworkerset_schema import SCHEMAS
from tests.deploy.tools import K8S, KUBERNETES_VERSION, only, render

LEADERWORKERSET = K8S / "leaderworkerset"
NAMESPACE = "default"


def docs() -> list[dict]:
    return copy.deepcopy(render(LEADERWORKERSET))


def lws() -> dict:
    return only(docs(), "LeaderWorkerSet")


def pod_template(lws: dict, index: int) -> dict:
    """The template of the group's pod ``index`` (0: the leader)."""
    spec = lws["spec"]["leaderWorkerTemplate"]
    if index == 0 and "leaderTemplate" in spec:
        return spec["leaderTemplate"]
    return spec["workerTemplate"]


def server_container(template: dict) -> dict:
    (container,) = template["spec"]["containers"]
    return container


def as_pod_template(template: dict, name: str) -> dict:
    """A pod template of the LeaderWorkerSet as the core PodTemplate object that
    kubernetes-validate knows."""
    return {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": name},
        "template": template,
    }


def validate(doc: dict) -> None:
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is None:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        return
    jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())
    spec = doc["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        if role in spec:
            kubernetes_validate.validate(
                as_pod_template(spec[role], role.lower()), KUBERNETES_VERSION, strict=True
            )


def test_manifests_validate() -> None:
    rendered = docs()
    assert {doc["kind"] for doc in rendered} == {"LeaderWorkerSet", "Service"}
    for doc in rendered:
        validate(doc)


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["leaderWorkerTemplate"].update(sise=2),
        lambda s: s["leaderWorkerTemplate"].pop("workerTemplate"),
        lambda s: s["leaderWorkerTemplate"].update(restartPolicy="Always"),
        lambda s: s["leaderWorkerTemplate"].update(size=0),
        lambda s: s.update(startupPolicy="LeaderStarted"),
        lambda s: s["rolloutStrategy"]["rollingUpdateConfiguration"].update(maxSurge="1 pod"),
        # A pod template's own fields are the core schema's: a misspelt probe fails.
        lambda s: server_container(s["leaderWorkerTemplate"]["leaderTemplate"]).update(
            readinesProbe={}
        ),
        lambda s: server_container(s["leaderWorkerTemplate"]["workerTemplate"]).update(
            args="--tensor-parallel-size=2"
        ),
    ],
    ids=[
        "misspelt",
        "no-worker-template",
        "bad-restart-policy",
        "size-0",
        "bad-startup-policy",
        "bad-max-surge",
        "pod-field",
        "pod-type",
    ],
)
def test_the_checks_refuse_a_mistake(change: Any) -> None:
    doc = lws()
    change(doc["spec"])
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(doc)


def expand(text: str, environ: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of a command's words: a variable the container
    has is replaced, $$ is a literal $, anything else stays as written."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return environ.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\((\w+)\)", one, text)


def lws_environment(doc: dict, index: int) -> dict[str, str]:
    """What LeaderWorkerSet sets in every container of pod ``index`` of group 0."""
    name = doc["metadata"]["name"]
    return {
        "LWS_GROUP_SIZE": str(doc["spec"]["leaderWorkerTemplate"]["size"]),
        "LWS_WORKER_INDEX": str(index),
        # The leader pod's name under the LeaderWorkerSet's headless Service.
        "LWS_LEADER_ADDRESS": f"{name}-0.{name}.{NAMESPACE}",
    }


def container_environment(container: dict) -> dict[str, str]:
    """The container's variables; one from a Secret or a resource gets a stand-in."""
    return {item["name"]: item.get("value", "1") for item in container.get("env", [])}


def node_engine(doc: dict, index: int, node_flags: bool = True) -> EngineConfig:
    """The engine settings pod ``index`` starts with; ``node_flags`` False: its command
    without --nnodes, --node-rank and --dist-init-addr, as if left to the variables."""
    container = server_container(pod_template(doc, index))
    environ = {**container_environment(container), **lws_environment(doc, index)}
    args = [expand(word, environ) for word in container["args"]]
    unexpanded = [word for word in args if "$(" in word]
    assert not unexpanded, f"variables no container has: {unexpanded}"
    if not node_flags:
        node = ("--nnodes=", "--node-rank=", "--dist-init-addr=")
        args = [word for word in args if not word.startswith(node)]
    parsed = build_serve_parser().parse_args(args)
    return server_settings_from_args(parsed, environ).engine


def test_every_pod_runs_one_engines_settings_as_its_node() -> None:
    doc = lws()
    size = doc["spec"]["leaderWorkerTemplate"]["size"]
    assert size == 2
    engines = [node_engine(doc, index) for index in range(size)]
    leader_address = lws_environment(doc, 0)["LWS_LEADER_ADDRESS"]
    for index, engine in enumerate(engines):
        assert (engine.nnodes, engine.node_rank) == (size, index)
        assert split_init_addr(engine.dist_init_addr) == (leader_address, 29500)
        assert engine.tensor_parallel_size == 2 and engine.tensor_parallel_size % size == 0
        # One engine: every node has the leader's settings, but for its place.
        assert engine.replace(node_rank=0) == engines[0]
        # The node flags say what the variables would: either way, the same settings.
        assert node_engine(doc, index, node_flags=False) == engine
    # Rank 0 hosts the rendezvous on the port the leader declares.
    leader = server_container(pod_template(doc, 0))
    ports = {p["name"]: p["containerPort"] for p in leader["ports"]}
    assert ports["rendezvous"] == split_init_addr(engines[0].dist_init_addr)[1]


def test_probes_and_the_service_are_the_leaders() -> None:
    rendered = docs()
    doc = only(rendered, "LeaderWorkerSet")
    leader_template, worker_template = pod_template(doc, 0), pod_template(doc, 1)
    leader, worker = server_container(leader_template), server_container(worker_template)
    env = container_environment(leader)
    (http,) = [p for p in leader["ports"] if p["name"] == "http"]
    assert http["containerPort"] == int(env["HETERO_PORT"])
    assert env["HETERO_HOST"] == "0.0.0.0"
    assert leader["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert leader["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert leader["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert leader[probe]["httpGet"]["port"] == "http"
        assert probe not in worker, f"a worker serves no HTTP: no {probe}"
    assert "http" not in {p["name"] for p in worker.get("ports", [])}
    assert "HETERO_API_KEY" not in container_environment(worker)
    key = next(item for item in leader["env"] if item["name"] == "HETERO_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["name"] == "hetero-infer-api-key"

    service = only(rendered, "Service")
    selector = service["spec"]["selector"]
    assert selector.items() <= leader_template["metadata"]["labels"].items()
    assert not selector.items() <= worker_template["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"http"}
    # LeaderWorkerSet names its own headless Service as itself.
    assert service["metadata"]["name"] != doc["metadata"]["name"]


def test_the_pods_agree() -> None:
    doc = lws()
    spec = doc["spec"]["leaderWorkerTemplate"]
    assert spec["restartPolicy"] == "RecreateGroupOnPodRestart"
    leader_template, worker_template = pod_template(doc, 0), pod_template(doc, 1)
    leader, worker = server_container(leader_template), server_container(worker_template)
    assert leader["image"] == worker["image"]
    assert leader["args"] == worker["args"]
    assert leader["resources"] == worker["resources"]
    assert leader["volumeMounts"] == worker["volumeMounts"]
    assert leader_template["spec"]["volumes"] == worker_template["spec"]["volumes"]
    leader_env, worker_env = container_environment(leader), container_environment(worker)
    for name in ("HETERO_MODEL", "HETERO_SHUTDOWN_TIMEOUT"):
        assert leader_env[name] == worker_env[name], name
    ranks_per_pod = node_engine(doc, 0).tensor_parallel_size // spec["size"]
    for template in (leader_template, worker_template):
        pod = template["spec"]
        (container,) = pod["containers"]
        # The drain fits the grace period (the worker waits out the leader's drain).
        pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        drain = float(container_environment(container)["HETERO_SHUTDOWN_TIMEOUT"])
        assert pod["terminationGracePeriodSeconds"] >= pause + drain + 5
        assert pod["enableServiceLinks"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        # The model is on a volume every pod mounts read-only.
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        model = container_environment(container)["HETERO_MODEL"]
        (mount,) = [m for path, m in mounts.items() if model.startswith(path + "/")]
        assert mount["readOnly"] is True
        gpus = container["resources"]["limits"].get("nvidia.com/gpu")
        assert gpus is None or int(gpus) == ranks_per_pod
