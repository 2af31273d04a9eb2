"""server/listen.py: the socket `hetero-infer serve` listens on."""

from __future__ import annotations

import asyncio
import socket

from hetero_infer.server.listen import bind_socket


def test_accepted_connections_run_without_nagles_algorithm():
    """asyncio sets TCP_NODELAY on what it accepts only from a socket that names TCP;
    with Nagle's algorithm on, a kept-alive connection's answer body waits ~40 ms for
    the client's delayed ACK."""
    listener = bind_socket("127.0.0.1", 0)
    listener.listen()
    port = listener.getsockname()[1]
    nodelay: list[int] = []

    async def accept_one() -> None:
        def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            nodelay.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(connected, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            for _ in range(100):
                if nodelay:
                    break
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(accept_one())
    assert nodelay and nodelay[0] != 0
