"""One HTTP GET to an address already checked (media_fetch.py decides which), with a
cap on the answer's size: the transport under image URLs.

It connects to the given IP address, not to the URL's host name: resolving the name
again here could give another address than the one checked (DNS rebinding). HTTPS still
checks the certificate against the host name (SNI and verification). h11 (uvicorn's
HTTP/1.1 parser, a dependency of ours) reads the answer, chunked or not.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from urllib.parse import SplitResult

import h11
from hetero_infer.server.errors import APIError

READ_SIZE = 64 * 1024
# The most an answer's status line and headers may take.
MAX_HEADER_BYTES = 64 * 1024
USER_AGENT = "hetero-infer"


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    # The Location header of a redirect (None: none given).
    location: str | None
    body: bytes


def too_large(param: str, limit: int) -> APIError:
    return APIError(
        413,
        f"{param}: the image is larger than this server takes ({limit} bytes, --max-image-bytes)",
        "request_too_large",
        param=param,
    )


async def http_get(url: SplitResult, address: str, max_bytes: int, param: str) -> HttpAnswer:
    """GET ``url`` from ``address``; a redirect's body is not read. Errors are 400s (413
    past ``max_bytes``) naming ``param``."""
    port = url.port or (443 if url.scheme == "https" else 80)
    context = ssl.create_default_context() if url.scheme == "https" else None
    try:
        reader, writer = await asyncio.open_connection(
            address, port, ssl=context, server_hostname=url.hostname if context else None
        )
    except (OSError, ssl.SSLError) as exc:
        raise _unreachable(url, param, exc) from None
    try:
        return await _exchange(url, reader, writer, max_bytes, param)
    except (OSError, ssl.SSLError) as exc:
        raise _unreachable(url, param, exc) from None
    except h11.ProtocolError:
        raise APIError(
            400, f"{param}: {url.hostname} did not answer in valid HTTP", param=param
        ) from None
    finally:
        writer.close()


async def _exchange(
    url: SplitResult,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    max_bytes: int,
    param: str,
) -> HttpAnswer:
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
    target = (url.path or "/") + (f"?{url.query}" if url.query else "")
    headers = [
        ("Host", _host_header(url)),
        ("User-Agent", USER_AGENT),
        ("Accept", "image/*"),
        ("Connection", "close"),
    ]
    writer.write(connection.send(h11.Request(method="GET", target=target, headers=headers)))
    writer.write(connection.send(h11.EndOfMessage()))
    await writer.drain()
    status, location = 0, None
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await reader.read(READ_SIZE))
        elif isinstance(event, h11.Response):
            status = event.status_code
            fields = {name.decode("latin-1"): value for name, value in event.headers}
            if "location" in fields:
                location = fields["location"].decode("latin-1")
            if not 200 <= status < 300:
                return HttpAnswer(status, location, b"")  # a redirect or a refusal: no image
            length = fields.get("content-length")
            if length is not None and int(length) > max_bytes:
                raise too_large(param, max_bytes)  # before reading any of it
        elif isinstance(event, h11.Data):
            body += event.data
            if len(body) > max_bytes:
                raise too_large(param, max_bytes)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return HttpAnswer(status, location, bytes(body))
        # An InformationalResponse (100 Continue) is followed by the real one.


def _host_header(url: SplitResult) -> str:
    host = url.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    return f"{host}:{url.port}" if url.port else host


def _unreachable(url: SplitResult, param: str, exc: Exception) -> APIError:
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return APIError(
        400, f"{param}: cannot fetch the image from {url.hostname}: {reason}", param=param
    )
