"""Loading a request's images (serving/chat_images.py over media_fetch.py, http_get.py
and image_decode.py): what a URL may reach, the limits on a fetch, and what decoding
refuses, each error a 400 (413 for size) naming the image's part.

The HTTP cases run against a small server this module starts on 127.0.0.1, which the
rules refuse unless --allowed-media-domains names it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import struct
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hetero_infer.engine.multimodal.pillow_arrow import rgbx_pixels
from hetero_infer.server.cli import build_serve_parser, server_settings_from_args
from hetero_infer.server.errors import APIError
from hetero_infer.server.serving import http_get, media_fetch
from hetero_infer.server.serving.chat_images import (
    ImageSource,
    check_image_limit,
    load_image,
    prepared_images,
)
from hetero_infer.server.serving.image_decode import decode_image
from hetero_infer.server.serving.media_fetch import is_public
from hetero_infer.server.settings import ServerSettings
from PIL import Image

from tests.server.local_origin import local_origin

PARAM = "messages.0.content.1"
LOCAL = ServerSettings(allowed_media_domains=("127.0.0.1",))


def png(size: tuple[int, int] = (3, 2), color: tuple[int, int, int] = (10, 20, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, color).save(out, format="PNG")
    return out.getvalue()


def noise_png(side: int = 64) -> bytes:
    """A PNG that does not compress: about 3 bytes a pixel."""
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG")
    return out.getvalue()


def with_declared_size(data: bytes, width: int, height: int) -> bytes:
    """A PNG whose header declares another size (its IHDR chunk rewritten, CRC fixed):
    a decompression bomb's header, without the megabytes."""
    ihdr = bytearray(data[12:29])  # b"IHDR" + 13 bytes of fields
    ihdr[4:12] = struct.pack(">II", width, height)
    return data[:12] + bytes(ihdr) + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def load(url: str, settings: ServerSettings = LOCAL) -> Image.Image:
    return asyncio.run(load_image(ImageSource(url, PARAM), settings, decode_image))


def refused(url: str, settings: ServerSettings = LOCAL, status: int = 400) -> APIError:
    """The error loading ``url`` raises, checked to name the part."""
    with pytest.raises(APIError) as caught:
        load(url, settings)
    error = caught.value
    assert error.status_code == status, error.message
    assert error.param == PARAM and error.message.startswith(PARAM), error.message
    return error


# ---- a tiny image server ----

BIG = noise_png()


class ImageServer(BaseHTTPRequestHandler):
    """GET /image.png, /big.png (with a Content-Length), /big-unsized.png (without: read
    to the end), /slow.png, /missing, /redirect?to=URL[&status=N] (302 unless N)."""

    seen: list[str] = []
    hosts: list[str] = []  # each request's Host header

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.seen.append(self.path)
        self.hosts.append(self.headers["Host"])
        parts = urlsplit(self.path)
        if parts.path == "/redirect":
            query = parse_qs(parts.query)
            self.send_response(int(query.get("status", ["302"])[0]))
            self.send_header("Location", query["to"][0])
            self.end_headers()
        elif parts.path in ("/image.png", "/big.png", "/slow.png"):
            if parts.path == "/slow.png":
                time.sleep(2)
            body = BIG if parts.path == "/big.png" else png()
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif parts.path == "/big-unsized.png":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(BIG)  # HTTP/1.0: the body ends when the connection does
        else:
            self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with local_origin(ImageServer) as url:
        yield url


# ---- which addresses a URL may reach ----


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.0.0.2", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254",
        "100.64.0.1", "0.0.0.0", "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::",
        "fe80::1", "fe80::1%2", "fc00::1", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
        "2002:7f00:1::", "2002:a00:1::",
    ],
)  # fmt: skip
def test_private_and_reserved_addresses_are_not_public(address):
    assert not is_public(address)


@pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_are(address):
    assert is_public(address)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "0", "2130706433", "[::1]"])
def test_a_loopback_host_is_refused_without_the_setting(origin, host):
    port = urlsplit(origin).port
    before = len(ImageServer.seen)
    error = refused(f"http://{host}:{port}/image.png", ServerSettings())
    assert "private or reserved address" in error.message
    assert len(ImageServer.seen) == before  # refused before any connection


def test_a_host_allowed_by_the_setting_is_fetched(origin):
    image = load(f"{origin}/image.png")
    assert image.mode == "RGB" and image.size == (3, 2)
    assert image.getpixel((0, 0)) == (10, 20, 30)


def test_with_the_setting_other_hosts_are_refused(origin):
    port = urlsplit(origin).port
    error = refused(f"http://localhost:{port}/image.png")
    assert "--allowed-media-domains" in error.message


def test_a_redirect_is_followed_and_checked_again(origin):
    assert load(f"{origin}/redirect?to=/image.png").size == (3, 2)
    # To a host the setting does not name.
    port = urlsplit(origin).port
    error = refused(f"{origin}/redirect?to=http://localhost:{port}/image.png")
    assert "--allowed-media-domains" in error.message


@pytest.mark.parametrize(
    "target", ["http://10.0.0.1/x.png", "http://169.254.169.254/latest", "http://[::1]:9/x"]
)
def test_a_redirect_to_a_private_address_is_refused(origin, monkeypatch, target):
    # The origin taken as public, as a public host would be: only its redirect is private.
    monkeypatch.setattr(media_fetch, "is_public", lambda a: a == "127.0.0.1" or is_public(a))
    assert load(f"{origin}/image.png", ServerSettings()).size == (3, 2)
    error = refused(f"{origin}/redirect?to={target}", ServerSettings())
    assert "private or reserved address" in error.message


def test_the_host_header_names_the_urls_host_and_port(origin):
    load(f"{origin}/image.png")
    assert ImageServer.hosts[-1] == urlsplit(origin).netloc  # 127.0.0.1:PORT


@pytest.mark.parametrize(("url", "port"), [("http://h/x", 80), ("https://h/x", 443)])
def test_a_url_without_a_port_uses_its_schemes(monkeypatch, url, port):
    reached = []

    async def refuse(address, port, **_):
        reached.append(port)
        raise OSError("refused here")

    monkeypatch.setattr(http_get.asyncio, "open_connection", refuse)
    with pytest.raises(APIError, match="refused here"):
        asyncio.run(http_get.http_get(urlsplit(url), "192.0.2.1", 100, "p"))
    assert reached == [port]


def test_redirects_are_followed_a_few_times_only(origin):
    url = f"{origin}/image.png"
    for _ in range(media_fetch.MAX_REDIRECTS):
        url = f"{origin}/redirect?to={url}"
    assert load(url).size == (3, 2)
    error = refused(f"{origin}/redirect?to={url}")
    assert "redirects more than" in error.message


def test_a_fetch_past_its_time_limit_is_refused(origin):
    settings = ServerSettings(allowed_media_domains=("127.0.0.1",), media_fetch_timeout=0.3)
    started = time.monotonic()
    error = refused(f"{origin}/slow.png", settings)
    assert "longer than 0.3 s" in error.message
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize("path", ["/big.png", "/big-unsized.png"])
def test_an_image_past_the_byte_limit_is_a_413(origin, path):
    settings = ServerSettings(allowed_media_domains=("127.0.0.1",), max_image_bytes=len(BIG) - 1)
    error = refused(f"{origin}{path}", settings, status=413)
    assert error.type == "request_too_large" and "--max-image-bytes" in error.message
    big = ServerSettings(allowed_media_domains=("127.0.0.1",), max_image_bytes=len(BIG))
    assert load(f"{origin}{path}", big).size == (64, 64)


def test_an_error_status_and_an_unreachable_host_are_400s(origin):
    assert "HTTP 404" in refused(f"{origin}/missing").message
    # Only a redirect status is followed (a 2xx's Location is not), and 300 (several
    # choices) is not a 2xx either.
    assert "HTTP 300" in refused(f"{origin}/redirect?to=/image.png&status=300").message
    assert "not an image" in refused(f"{origin}/redirect?to=/image.png&status=201").message
    with ThreadingHTTPServer(("127.0.0.1", 0), ImageServer) as closed:
        port = closed.server_address[1]  # closed: a connection to it is refused
    assert "cannot fetch" in refused(f"http://127.0.0.1:{port}/image.png").message


@pytest.mark.parametrize(
    "url", ["ftp://example.com/x.png", "x.png", "", "http:///x.png", "http://host:99999/x"]
)
def test_other_urls_are_refused(url):
    refused(url)


# ---- data: URLs and decoding ----


def test_a_data_url_is_decoded_to_rgb():
    image = load(data_url(png((5, 4), (1, 2, 3))))
    assert image.mode == "RGB" and image.size == (5, 4) and image.getpixel((4, 3)) == (1, 2, 3)


def test_an_image_may_have_as_many_pixels_as_the_limit():
    assert decode_image(png((3, 2)), "p", max_pixels=6).size == (3, 2)
    with pytest.raises(APIError, match="3 x 2 pixels, more than 5"):
        decode_image(png((3, 2)), "p", max_pixels=5)


def test_transparency_is_laid_over_white():
    out = io.BytesIO()
    Image.new("RGBA", (2, 2), (0, 0, 0, 0)).save(out, format="PNG")
    assert load(data_url(out.getvalue())).getpixel((0, 0)) == (255, 255, 255)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not an image at all", "not an image"),
        (png()[:-30], "cannot be decoded"),  # truncated
        (with_declared_size(png(), 10_000, 5_000), "too large"),  # past our limit
        (with_declared_size(png(), 20_000, 20_000), "too large"),  # past PIL's own
    ],
    ids=["not-an-image", "truncated", "bomb", "bomb-past-pil"],
)
def test_bad_image_data_is_a_400_naming_the_part(data, problem):
    assert problem in refused(data_url(data)).message


def test_formats_outside_the_list_are_refused():
    out = io.BytesIO()
    Image.new("RGB", (2, 2)).save(out, format="TIFF")
    assert "PNG, JPEG" in refused(data_url(out.getvalue(), "image/tiff")).message


@pytest.mark.parametrize("url", ["data:image/png,abc", "data:image/png;base64,@@@@", "data:"])
def test_a_data_url_must_be_base64(url):
    refused(url)


def test_a_data_url_past_the_byte_limit_is_a_413():
    data = png()
    refused(data_url(data), ServerSettings(max_image_bytes=len(data) - 1), status=413)
    refused(data_url(BIG), ServerSettings(max_image_bytes=100), status=413)  # not decoded


def test_a_data_url_holds_up_to_the_byte_limit(monkeypatch):
    """Exactly max_bytes decode, whatever the padding; one more is a 413, and text
    too long for the limit is refused before any decoding."""
    for size in range(1, 7):
        data = bytes(range(size))
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        assert media_fetch.data_url_bytes(url, size, "p") == data
        with pytest.raises(APIError) as error:
            media_fetch.data_url_bytes(url, size - 1, "p")
        assert error.value.status_code == 413
    monkeypatch.setattr(media_fetch.base64, "b64decode", None)  # decoding would fail
    with pytest.raises(APIError) as error:
        media_fetch.data_url_bytes("data:image/png;base64," + "A" * 12, 6, "p")
    assert error.value.status_code == 413


@pytest.mark.parametrize(
    ("url", "problem"),
    [("data:image/png,QUFB", "must be data:"), ("data:image/png;base64,QU@FB", "not valid base64")],
)
def test_a_data_url_is_base64_throughout(url, problem):
    with pytest.raises(APIError, match=problem):
        media_fetch.data_url_bytes(url, 100, "p")


def test_images_load_in_order():
    sources = [ImageSource(data_url(png((i + 1, 1))), f"messages.0.content.{i}") for i in range(6)]
    images = asyncio.run(prepared_images(sources, LOCAL, decode_image))
    assert [image.size for image in images] == [(i + 1, 1) for i in range(6)]


def test_the_first_bad_image_of_several_is_named():
    sources = [
        ImageSource(data_url(png()), "messages.0.content.0"),
        ImageSource("data:image/png;base64,AAAA", "messages.1.content.2"),
    ]
    with pytest.raises(APIError) as caught:
        asyncio.run(prepared_images(sources, LOCAL, decode_image))
    assert caught.value.param == "messages.1.content.2"


# ---- file:// URLs ----


def test_file_urls_need_the_setting(tmp_path: Path):
    (tmp_path / "a.png").write_bytes(png())
    error = refused(f"file://{tmp_path}/a.png", ServerSettings())
    assert "--allowed-local-media-path" in error.message


def test_file_urls_read_only_under_the_folder(tmp_path: Path):
    folder = tmp_path / "media"
    folder.mkdir()
    (folder / "a b.png").write_bytes(png((4, 4)))
    (tmp_path / "secret.png").write_bytes(png())
    (folder / "link.png").symlink_to(tmp_path / "secret.png")
    settings = ServerSettings(allowed_local_media_path=str(folder))
    assert load(f"file://{folder}/a%20b.png", settings).size == (4, 4)
    for url in (
        f"file://{tmp_path}/secret.png",
        f"file://{folder}/../secret.png",
        f"file://{folder}/link.png",
        f"file://{folder}/missing.png",
        f"file://{folder}",
        f"file://otherhost{folder}/a%20b.png",
    ):
        refused(url, settings)
    small = ServerSettings(allowed_local_media_path=str(folder), max_image_bytes=10)
    refused(f"file://{folder}/a%20b.png", small, status=413)


def test_the_settings_check_their_values(tmp_path: Path):
    with pytest.raises(ValueError, match="allowed_local_media_path"):
        ServerSettings(allowed_local_media_path=str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="media_fetch_timeout"):
        ServerSettings(media_fetch_timeout=0)
    with pytest.raises(ValueError, match="max_image_bytes"):
        ServerSettings(max_image_bytes=0)
    assert ServerSettings(allowed_media_domains="A.com, b.com").allowed_media_domains == (
        "a.com",
        "b.com",
    )


def test_the_flags_and_variables_reach_the_settings(tmp_path: Path):
    args = build_serve_parser().parse_args(
        [
            "--allowed-media-domains", "127.0.0.1", "Images.Example.com",
            "--allowed-local-media-path", str(tmp_path),
            "--media-fetch-timeout", "2.5",
            "--max-image-bytes", "1000",
        ]
    )  # fmt: skip
    settings = server_settings_from_args(args, {})
    assert settings.allowed_media_domains == ("127.0.0.1", "images.example.com")
    assert settings.allowed_local_media_path == str(tmp_path)
    assert (settings.media_fetch_timeout, settings.max_image_bytes) == (2.5, 1000)
    environ = {"HETERO_ALLOWED_MEDIA_DOMAINS": "a.com,b.com", "HETERO_MAX_IMAGE_BYTES": "5"}
    settings = server_settings_from_args(build_serve_parser().parse_args([]), environ)
    assert settings.allowed_media_domains == ("a.com", "b.com") and settings.max_image_bytes == 5
    defaults = server_settings_from_args(build_serve_parser().parse_args([]), {})
    assert defaults.allowed_media_domains == () and defaults.allowed_local_media_path is None
    assert (defaults.media_fetch_timeout, defaults.max_image_bytes) == (10.0, 20 * 1024 * 1024)


# ---- --limit-mm-per-prompt ----


def test_the_image_limit_is_parsed_as_vllm_takes_it():
    assert ServerSettings().limit_mm_per_prompt == {"image": 999, "video": 999, "audio": 999}
    given = ServerSettings(limit_mm_per_prompt='{"image": 2, "video": 0}').limit_mm_per_prompt
    assert given == {"image": 2, "video": 0, "audio": 999}
    assert ServerSettings(limit_mm_per_prompt={"audio": 1}).limit_mm_per_prompt["audio"] == 1
    args = build_serve_parser().parse_args(["--limit-mm-per-prompt", '{"image": 1}'])
    assert server_settings_from_args(args, {}).limit_mm_per_prompt["image"] == 1
    environ = {"HETERO_LIMIT_MM_PER_PROMPT": '{"image": 3}'}
    settings = server_settings_from_args(build_serve_parser().parse_args([]), environ)
    assert settings.limit_mm_per_prompt["image"] == 3


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('{"images": 2}', "unknown modality 'images' (one of image, video, audio)"),
        ('{"image": -1}', "image's limit must be a non-negative integer, got -1"),
        ('{"image": 1.5}', "image's limit must be a non-negative integer, got 1.5"),
        ('{"image": "2"}', "image's limit must be a non-negative integer, got '2'"),
        ('{"image": true}', "image's limit must be a non-negative integer, got True"),
        ('{"image": {"count": 2}}', "image's limit must be a non-negative integer"),
        ("[2]", "expected a JSON object"),
        ("image=2", "is not JSON"),
    ],
)
def test_a_bad_image_limit_stops_the_start(value, problem):
    with pytest.raises(ValueError, match="limit_mm_per_prompt") as caught:
        ServerSettings(limit_mm_per_prompt=value)
    assert problem in str(caught.value)


def test_the_image_limit_names_the_first_image_past_it():
    parts = [ImageSource("data:,", f"messages.0.content.{j}") for j in (1, 3, 5)]
    check_image_limit(parts[:2], ServerSettings(limit_mm_per_prompt='{"image": 2}'))
    with pytest.raises(APIError) as caught:
        check_image_limit(parts, ServerSettings(limit_mm_per_prompt='{"image": 2}'))
    error = caught.value
    assert (error.status_code, error.param) == (400, "messages.0.content.5")
    assert error.message == (
        "messages.0.content.5: at most 2 image(s) per prompt (--limit-mm-per-prompt), 3 given"
    )
    with pytest.raises(APIError, match=r"^messages\.0\.content\.1: at most 0 image"):
        check_image_limit(parts, ServerSettings(limit_mm_per_prompt='{"image": 0}'))


def test_a_decoded_photo_lies_in_one_block_of_pillow_memory():
    """A 12 MP photo (48 MB as Pillow keeps it, past its default 16 MB blocks) in one
    block: the processors read its pixels where they lie (pillow_arrow.py)."""
    file = io.BytesIO()
    Image.new("RGB", (4032, 3024), (200, 30, 90)).save(file, format="JPEG")
    assert rgbx_pixels(decode_image(file.getvalue(), PARAM)) is not None
