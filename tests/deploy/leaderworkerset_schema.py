"""A JSON Schema for LeaderWorkerSet (leaderworkerset.x-k8s.io/v1, Kubernetes SIG Apps'
LWS) as a manifest writes it: no package on PyPI, npm or Debian ships its CRD as a
schema or model. Written from the API's reference (its Go types' fields, enums,
defaults and bounds). Objects are closed, as in inference_schemas.py, so a misspelt
field fails. The two pod templates are left open here: the tests validate each as a
core PodTemplate against the Kubernetes API schemas (kubernetes-validate, strict),
which know every field of a pod.
"""

from __future__ import annotations

from typing import Any

from tests.deploy.inference_schemas import closed, resource

COUNT = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
# intstr.IntOrString as the rollout takes it: a number of groups or a percentage.
INT_OR_PERCENT = {
    "anyOf": [
        {"type": "integer", "minimum": 0},
        {"type": "string", "pattern": r"^(100|[1-9]?[0-9])%$"},
    ]
}
POD_TEMPLATE = {"type": "object", "required": ["spec"]}  # checked as a core PodTemplate

LEADER_WORKER_TEMPLATE = closed(
    {
        "leaderTemplate": POD_TEMPLATE,
        "workerTemplate": POD_TEMPLATE,
        # Pods in a group, the leader included.
        "size": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
        # "Default" is the deprecated name of "None".
        "restartPolicy": {
            "enum": ["RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None", "Default"]
        },
        "subGroupPolicy": closed(
            {
                "subGroupPolicyType": {"enum": ["LeaderWorker", "LeaderExcluded"]},
                "subGroupSize": {"type": "integer", "minimum": 1},
            }
        ),
        "volumeClaimTemplates": {"type": "array", "items": {"type": "object"}},
        "persistentVolumeClaimRetentionPolicy": closed(
            {
                "whenDeleted": {"enum": ["Retain", "Delete"]},
                "whenScaled": {"enum": ["Retain", "Delete"]},
            }
        ),
    },
    ("workerTemplate",),
)

LEADER_WORKER_SET_V1 = resource(
    "leaderworkerset.x-k8s.io/v1",
    "LeaderWorkerSet",
    closed(
        {
            # Groups (a leader and its workers each).
            "replicas": COUNT,
            "leaderWorkerTemplate": LEADER_WORKER_TEMPLATE,
            "rolloutStrategy": closed(
                {
                    "type": {"enum": ["RollingUpdate"]},
                    "rollingUpdateConfiguration": closed(
                        {
                            "partition": COUNT,
                            "maxUnavailable": INT_OR_PERCENT,
                            "maxSurge": INT_OR_PERCENT,
                        }
                    ),
                },
                ("type",),
            ),
            "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
            "networkConfig": closed(
                {"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}},
                ("subdomainPolicy",),
            ),
        },
        ("leaderWorkerTemplate",),
    ),
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET_V1,
}
