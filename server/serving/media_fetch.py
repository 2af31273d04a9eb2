"""The bytes an image's URL names (read_media): a data: URL's own, a file's under
--allowed-local-media-path, or an http(s) answer's.

Fetching a URL is a request the server makes on a client's behalf, so it must not
reach what only the server can (its own ports, the cloud's metadata service, the private
network): every address a host name resolves to must be public, each redirect's too
(followed here, a few at most, each hop checked again), and the connection goes to the
address checked. --allowed-media-domains turns that around, as vLLM's does: only the
hosts it names are fetched, at whatever address (the operator named them). Each error
is a 400 naming the image's place in the body (413 for one too large).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import socket
from pathlib import Path
from urllib.parse import SplitResult, unquote, urljoin, urlsplit

from hetero_infer.server.errors import APIError
from hetero_infer.server.serving.http_get import http_get, too_large
from hetero_infer.server.settings import ServerSettings

# Redirects followed before giving up (a few, as browsers' dozens serve no image).
MAX_REDIRECTS = 3
REDIRECTS = (301, 302, 303, 307, 308)
# How much of a URL an error message repeats.
SHOWN_URL_CHARS = 100


async def read_media(url: str, settings: ServerSettings, param: str) -> bytes:
    """The bytes ``url`` names, under the server's rules on fetching and size."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":  # megabytes of base64 to decode: off the event loop too
        return await asyncio.to_thread(data_url_bytes, url, settings.max_image_bytes, param)
    if scheme == "file":
        return await asyncio.to_thread(_file_bytes, url, settings, param)
    if scheme in ("http", "https"):
        try:
            async with asyncio.timeout(settings.media_fetch_timeout):
                return await _fetched(url, settings, param)
        except TimeoutError:
            raise APIError(
                400,
                f"{param}: fetching the image took longer than {settings.media_fetch_timeout:g} "
                "s (--media-fetch-timeout)",
                param=param,
            ) from None
    raise APIError(
        400,
        f"{param}: an image's url must be a data: URL (base64), an http(s) URL or a file:// "
        f"URL, not {_shown(url)!r}",
        param=param,
    )


def data_url_bytes(url: str, max_bytes: int, param: str) -> bytes:
    """The bytes of ``data:[<media type>][;base64],<data>``; only base64 data is taken
    (an image's bytes as text). The media type is not trusted: decoding reads the bytes."""
    header, comma, data = url.partition(",")
    if not comma or not header.lower().endswith(";base64"):
        raise APIError(
            400, f"{param}: a data URL must be data:<media type>;base64,<data>", param=param
        )
    if len(data) // 4 * 3 > max_bytes + 2:  # base64 takes 4 characters for 3 bytes
        raise too_large(param, max_bytes)
    try:
        decoded = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(
            400, f"{param}: the data URL's data is not valid base64", param=param
        ) from None
    if len(decoded) > max_bytes:
        raise too_large(param, max_bytes)
    return decoded


async def _fetched(url: str, settings: ServerSettings, param: str) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        parts = _http_url(url, param)
        addresses = await _checked_addresses(parts, settings, param)
        answer = None
        for address in addresses:  # the first that connects
            try:
                answer = await http_get(parts, address, settings.max_image_bytes, param)
                break
            except APIError as error:
                if error.status_code == 413 or address == addresses[-1]:
                    raise
        assert answer is not None
        if answer.status in REDIRECTS and answer.location:
            url = urljoin(url, answer.location)
            continue
        if not 200 <= answer.status < 300:
            raise APIError(
                400,
                f"{param}: fetching the image from {parts.hostname} answered HTTP {answer.status}",
                param=param,
            )
        return answer.body
    raise APIError(
        400, f"{param}: the image's URL redirects more than {MAX_REDIRECTS} times", param=param
    )


def _http_url(url: str, param: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port out of range raises here)
    except ValueError:
        parts = None
    if parts is None or parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise APIError(400, f"{param}: {_shown(url)!r} is not an http(s) URL", param=param)
    return parts


async def _checked_addresses(parts: SplitResult, settings: ServerSettings, param: str) -> list[str]:
    """The addresses ``parts``' host resolves to, every one of them public unless the
    host is one --allowed-media-domains names (then only those hosts are fetched)."""
    host = (parts.hostname or "").lower()
    allowed = settings.allowed_media_domains
    if allowed and host not in allowed:
        raise APIError(
            400,
            f"{param}: {host} is not among the hosts this server fetches images from "
            "(--allowed-media-domains)",
            param=param,
        )
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, parts.port or 0, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise APIError(400, f"{param}: cannot resolve the host {host}", param=param) from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
    if not allowed:
        for address in addresses:
            if not is_public(address):
                raise APIError(
                    400,
                    # Which address is not said: it would tell what names resolve to
                    # inside the server's network.
                    f"{param}: {host} is at a private or reserved address; "
                    "this server fetches images only from public addresses, or from the "
                    "hosts --allowed-media-domains names",
                    param=param,
                )
    if not addresses:
        raise APIError(400, f"{param}: cannot resolve the host {host}", param=param)
    return addresses


def is_public(address: str) -> bool:
    """Whether ``address`` is one anyone on the internet may reach: not loopback,
    link-local, private, shared (carrier NAT), multicast, reserved or unspecified; an
    IPv4 address inside an IPv6 one (mapped, 6to4, Teredo) is judged by itself."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])  # less an IPv6 zone
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None and not is_public(str(inner)):
            return False
    refused = (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )
    return ip.is_global and not refused


def _file_bytes(url: str, settings: ServerSettings, param: str) -> bytes:
    """A file:// URL's file, which must lie under --allowed-local-media-path (its real
    path, links followed: a link inside pointing outside is refused)."""
    folder = settings.allowed_local_media_path
    if folder is None:
        raise APIError(
            400,
            f"{param}: file:// URLs are refused: this server reads no local files "
            "(--allowed-local-media-path)",
            param=param,
        )
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise APIError(400, f"{param}: a file:// URL must name a local file", param=param)
    try:
        path = Path(unquote(parts.path)).resolve()
        inside = path.is_relative_to(Path(folder).resolve())
        if inside and path.stat().st_size > settings.max_image_bytes:
            raise too_large(param, settings.max_image_bytes)
        data = path.read_bytes() if inside else b""
    except (OSError, ValueError):
        inside, data = False, b""
    if not inside:
        raise APIError(
            400,
            f"{param}: no such file under the folder this server reads images from "
            "(--allowed-local-media-path)",
            param=param,
        )
    if len(data) > settings.max_image_bytes:  # it grew since
        raise too_large(param, settings.max_image_bytes)
    return data


def _shown(url: str) -> str:
    return url if len(url) <= SHOWN_URL_CHARS else url[:SHOWN_URL_CHARS] + "..."
