"""The server's socket, bound before anything else happens.

Bound first, so that a port in use ends the process within a second, before the
model and its libraries load (minutes for a large model) and before their log lines
bury the error. It listens only once the engine's settings have been checked
(serve.py); until then the port is held and connections are refused.
"""

from __future__ import annotations

import socket


def bind_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening; OSError where the port is in
    use or the address is not this machine's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As uvicorn binds: a port left in TIME_WAIT by a server just stopped is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
