"""An http server on 127.0.0.1 for the image-fetching tests: the origin an image URL
points at."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def local_origin(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Its base URL (http://127.0.0.1:PORT) while the block runs, ``handler`` answering."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
