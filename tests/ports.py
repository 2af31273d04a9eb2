"""Ports for the servers the tests start.

Taken below the kernel's ephemeral range (32768-60999 by default), where outgoing
connections get their local ports: a port some client connection holds cannot be bound
by a server, and a port picked by binding port 0 and let go was such a port again
within the seconds a server process takes to start (a replica failed with "Address
already in use"). Each pytest-xdist worker takes its own block, and a process never
hands out one port twice, so neither another worker nor the same test's next server
can be given a port in the moment before its server binds it.
"""

from __future__ import annotations

import itertools
import os
import socket

FIRST_PORT = 20000
PORTS_PER_WORKER = 1000


def _worker_ports() -> itertools.cycle[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # gw0, gw1, ... under xdist
    index = int(worker.removeprefix("gw")) if worker.removeprefix("gw").isdigit() else 0
    first = FIRST_PORT + index * PORTS_PER_WORKER
    return itertools.cycle(range(first, first + PORTS_PER_WORKER))


_PORTS = _worker_ports()


def free_socket() -> socket.socket:
    """A listening-ready socket bound to a free port on 127.0.0.1.

    Made with its protocol named, as uvicorn's own binding makes it: asyncio turns
    Nagle's algorithm off (TCP_NODELAY) only on connections accepted from such a
    socket. Without it, on a kept-alive connection each answer's body (sent after its
    headers) waited for the client's delayed ACK, 40 ms a request."""
    for port in itertools.islice(_PORTS, PORTS_PER_WORKER):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        return sock
    raise RuntimeError(f"no free port in this worker's {PORTS_PER_WORKER}")


def free_port() -> int:
    """A free port for a server process to bind (let go here)."""
    with free_socket() as sock:
        return sock.getsockname()[1]
