"""Serve an ASGI app with uvicorn in a background thread, on a socket bound by the caller.

Used by CaptureServer and by the fake engine. The socket is bound before the thread starts so the
port (`0` = any free one) is known when `start()` returns and a bind error is raised in the caller's
thread. uvloop and httptools are used when installed: they halve uvicorn's per-request CPU. An app
may have some of its requests served in `capture.fast_lane` (the capture proxy's model calls).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from .fast_lane import FastLaneHandler, fast_lane_protocol

__all__ = ["ThreadedUvicorn", "fast_http", "fast_loop", "read_body"]


async def read_body(receive: Any) -> bytes:
    """A request's whole body from an ASGI `receive` (for apps with no limit of their own to keep:
    the fake engine, the bench's relay, test apps; the proxy's routes read with theirs)."""
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


def fast_loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


def fast_http() -> str:
    try:
        import httptools  # noqa: F401
    except ImportError:
        return "h11"
    return "httptools"


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class ThreadedUvicorn:
    """One uvicorn server on its own thread and event loop."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0,
                 fast_lane: tuple[Callable[[str], FastLaneHandler | None], int] | None = None
                 ) -> None:
        """`fast_lane`: (claim, body limit) for `capture.fast_lane` (used when httptools is)."""
        self.app = app
        self.fast_lane = fast_lane
        self.host = host
        self.port = port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    def start(self, timeout_s: float = 30.0) -> int:
        """Bind, start serving, wait until uvicorn is up; returns the bound port."""
        self._socket = bind(self.host, self.port)
        self.port = self._socket.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            loop=fast_loop(),
            http=self._protocol(),
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_keep_alive=120,
            # X-Forwarded-* from a local client would be believed by default; nothing here reads
            # the client address, and the middleware is one more layer on every call.
            proxy_headers=False,
            backlog=2048,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, name=f"uvicorn-{self.port}",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited during start-up")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"server on port {self.port} did not start in {timeout_s}s")
            time.sleep(0.01)
        return self.port

    def _protocol(self) -> Any:
        if fast_http() != "httptools" or self.fast_lane is None:
            return fast_http()
        return fast_lane_protocol(*self.fast_lane) or fast_http()

    def _serve(self) -> None:
        assert self._server is not None and self._socket is not None
        serve = self._server.serve(sockets=[self._socket])
        if fast_loop() == "uvloop":
            import uvloop

            asyncio.run(serve, loop_factory=uvloop.new_event_loop)
        else:
            asyncio.run(serve)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout_s)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None
