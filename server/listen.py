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
    # The protocol named, as uvicorn binds: asyncio turns Nagle's algorithm off
    # (TCP_NODELAY) only on connections accepted from such a socket. Without it a
    # kept-alive connection's answer body, sent after its headers, waited ~40 ms for the
    # client's delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        # As uvicorn binds: a port left in TIME_WAIT by a server just stopped is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
