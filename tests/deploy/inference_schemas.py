"""JSON Schemas for the two custom resources of deploy/k8s/inference-pool that no
package on PyPI, npm or Debian ships a schema or model for: the Gateway API Inference
Extension's InferencePool (inference.networking.k8s.io/v1, the extension's GA API,
v1.0 and later) and the Gateway API's HTTPRoute (gateway.networking.k8s.io/v1).

Written from the APIs' reference documentation: each field's type, the required
fields, enums, patterns and bounds. Objects are closed (additionalProperties: false),
so an unknown or misspelt field fails, as kubernetes-validate's strict mode fails it
for the core objects. HTTPRoute covers the fields a route to an InferencePool uses
(parents, path matches, backends, timeouts), not filters or header matches, which a
manifest here would have to add to the schema first.
"""

from __future__ import annotations

from typing import Any

# RFC 1123 subdomain, or "" for the core group.
GROUP = {
    "type": "string",
    "maxLength": 253,
    "pattern": r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
}
KIND = {
    "type": "string",
    "minLength": 1,
    "maxLength": 63,
    "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$",
}
OBJECT_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
NAMESPACE = {
    "type": "string",
    "minLength": 1,
    "maxLength": 63,
    "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
}
PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
LABEL_KEY = {
    "type": "string",
    "minLength": 1,
    "maxLength": 253,
    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$",
}
LABEL_VALUE = {
    "type": "string",
    "maxLength": 63,
    "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
}
# Gateway API durations: up to four number-unit pairs, e.g. "1h30m", "600s".
DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
METADATA = {
    "type": "object",
    "properties": {
        "name": {
            "type": "string",
            "maxLength": 253,
            "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        },
        "namespace": NAMESPACE,
        "labels": {
            "type": "object",
            "propertyNames": LABEL_KEY,
            "additionalProperties": LABEL_VALUE,
        },
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "required": ["name"],
    "additionalProperties": False,
}


def closed(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """An object schema that refuses fields it does not name."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


def resource(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A namespaced resource as written in a manifest: no status."""
    return closed(
        {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": METADATA,
            "spec": spec,
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


PORT = closed({"number": PORT_NUMBER}, ("number",))

ENDPOINT_PICKER_REF = closed(
    {
        "group": GROUP,
        "kind": KIND,
        "name": OBJECT_NAME,
        "port": PORT,
        "failureMode": {"enum": ["FailOpen", "FailClose"]},
    },
    ("name",),
) | {
    # "Port is required when the referent is a Kubernetes Service" (the default kind).
    "if": {
        "anyOf": [{"not": {"required": ["kind"]}}, {"properties": {"kind": {"const": "Service"}}}]
    },
    "then": {"required": ["port"]},
}

INFERENCE_POOL_V1 = resource(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    closed(
        {
            "selector": closed(
                {
                    "matchLabels": {
                        "type": "object",
                        "minProperties": 1,
                        "maxProperties": 64,
                        "propertyNames": LABEL_KEY,
                        "additionalProperties": LABEL_VALUE,
                    }
                },
                ("matchLabels",),
            ),
            # A list-map keyed by number: each port at most once.
            "targetPorts": {
                "type": "array",
                "items": PORT,
                "minItems": 1,
                "maxItems": 8,
                "uniqueItems": True,
            },
            "endpointPickerRef": ENDPOINT_PICKER_REF,
        },
        ("selector", "targetPorts", "endpointPickerRef"),
    ),
)

PARENT_REF = closed(
    {
        "group": GROUP,
        "kind": KIND,
        "namespace": NAMESPACE,
        "name": OBJECT_NAME,
        "sectionName": {"type": "string", "minLength": 1, "maxLength": 253},
        "port": PORT_NUMBER,
    },
    ("name",),
)
BACKEND_REF = closed(
    {
        "group": GROUP,
        "kind": KIND,
        "name": OBJECT_NAME,
        "namespace": NAMESPACE,
        "port": PORT_NUMBER,
        "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
    },
    ("name",),
)
PATH_MATCH = closed(
    {
        "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
        "value": {"type": "string", "maxLength": 1024},
    }
)
HTTP_ROUTE_V1 = resource(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    closed(
        {
            "parentRefs": {"type": "array", "items": PARENT_REF, "maxItems": 32},
            "hostnames": {"type": "array", "items": {"type": "string"}, "maxItems": 16},
            "rules": {
                "type": "array",
                "maxItems": 16,
                "items": closed(
                    {
                        "matches": {
                            "type": "array",
                            "maxItems": 64,
                            "items": closed({"path": PATH_MATCH}),
                        },
                        "backendRefs": {"type": "array", "items": BACKEND_REF, "maxItems": 16},
                        "timeouts": closed({"request": DURATION, "backendRequest": DURATION}),
                    }
                ),
            },
        }
    ),
)

SCHEMAS = {
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL_V1,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE_V1,
}
