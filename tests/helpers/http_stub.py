"""A real HTTP server on a loopback port that answers every GET with one fixed body: a stand-in
for "some other server" (a proxy a sandbox must not reach, a process that took an engine's port)."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator

__all__ = ["serving"]


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[int]:
    """Serve `body` with status 200 on every GET until the block ends; yields the port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
