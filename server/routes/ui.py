"""GET /: the built-in chat page, and its two assets under /static/.

Plain files shipped in the package (server/static/), read once: no build step, no CDN.
The page needs no API key; its own calls to /v1/* send the key the user types. HEAD /
answers as GET / does, without the page: it is the probe by which Ollama's command
line finds its server running (a 405 there reads as no server).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(include_in_schema=False)

# name -> media type; only these are served (no path from the URL reaches the disk).
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
}
# Revalidate each load, so a restarted server with a new page is never hidden by a cache.
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}


@cache
def _read(name: str) -> bytes:
    # The installed package's name: the source folder's ("server") is importable only
    # from a checkout's root.
    return resources.files("hetero_infer.server").joinpath("static", name).read_bytes()


def _asset(name: str) -> Response:
    return Response(_read(name), media_type=ASSETS[name], headers=_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"])
async def chat_page() -> Response:
    return _asset("index.html")


@router.get("/static/chat.css")
async def chat_css() -> Response:
    return _asset("chat.css")


@router.get("/static/chat.js")
async def chat_js() -> Response:
    return _asset("chat.js")
