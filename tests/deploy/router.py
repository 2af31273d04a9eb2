"""The cache-aware router (PyPI's sglang-router, a Rust binary in a wheel) as a process
on loopback, in front of servers that the test started.

The flags are the ones "Replicas behind a router" (docs/deployment.md) and
docker-compose.yml give: a health check every second, one failure to leave a replica
out, and retries spread over more than a second, so that the retries of a request sent
to a replica that just died go to a live one.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.ports import free_port
from tests.server.conftest import wait_until

# A router waits for every worker's /health before it serves; the workers here are
# already up, so this bounds only the router's own start.
ROUTER_STARTUP_TIMEOUT = 60.0


@dataclass
class RouterProcess:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def readiness(self) -> dict:
        """The router's own view: how many of its workers pass their health check."""
        return httpx.get(f"{self.url}/readiness", timeout=5).json()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


def router_args(worker_urls: list[str], host: str, port: int, metrics_port: int) -> list[str]:
    """sglang-router's command line for our replicas."""
    return [
        "--worker-urls",
        *worker_urls,
        "--policy",
        "cache_aware",
        "--host",
        host,
        "--port",
        str(port),
        "--prometheus-host",
        host,
        "--prometheus-port",
        str(metrics_port),
        # vLLM's /health (which the server answers as its readiness), probed every
        # second; one failure leaves a replica out until it passes again.
        "--health-check-endpoint",
        "/health",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1",
        # Retries 100 ms, then 200, 400, 800 and 1600 ms apart: longer together than
        # a health check period, so a request sent to a replica that just died is
        # retried until the check has left it out, and then lands on a live one.
        "--retry-initial-backoff-ms",
        "100",
        "--retry-backoff-multiplier",
        "2",
    ]


def start_router(worker_urls: list[str], log_dir: Path) -> RouterProcess:
    """Run the router on free loopback ports; return once it sees every worker healthy."""
    port, metrics_port = free_port(), free_port()
    log_path = log_dir / f"router-{port}.log"
    args = [sys.executable, "-m", "sglang_router.launch_router"]
    args += router_args(worker_urls, "127.0.0.1", port, metrics_port)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    router = RouterProcess(f"http://127.0.0.1:{port}", process, log_path)

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the router exited with {process.returncode}:\n{router.log()}")
        try:
            return router.readiness().get("healthy_workers") == len(worker_urls)
        except (httpx.TransportError, ValueError):
            return False

    try:
        wait_until(ready, ROUTER_STARTUP_TIMEOUT, "the router to see its workers", interval=0.2)
    except BaseException:
        router.stop()
        raise
    return router
