"""Serve an ASGI app with uvicorn in a background thread, on a socket bound by the caller.

Used by CaptureServer and by the fake engine. The socket is bound before the thread starts so the
port (`0` = any free one) is known when `start()` returns and a bind error is raised in the caller's
thread. uvloop and httptools are used when installed: they halve uvicorn's per-request CPU. An app
may have some of its requests served in `capture.fast_lane` (the capture proxy's model calls), and
be served on more than one address by the same server and event loop (the proxy's admin listener).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from .fast_lane import FastLaneHandler, FastLaneProtocol, fast_lane_protocol
from .guard import Limits

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
                 fast_lane: tuple[Callable[[str], FastLaneHandler | None], int] | None = None,
                 *, limits: Limits | None = None, also: tuple[str, int] | None = None) -> None:
        """`fast_lane`: (claim, body limit) for `capture.fast_lane` (used when httptools is);
        `limits`: capture.guard's connection bound and read times; `also`: a second address
        (host, port) served by the same server (`also_port` once started)."""
        self.app = app
        self.fast_lane = fast_lane
        self.limits = limits
        self.host = host
        self.port = port
        self.also = also
        self.also_port: int | None = None
        self.guarded = False  # whether guard's read times run (the fast-lane protocol serves)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sockets: list[socket.socket] = []

    def start(self, timeout_s: float = 30.0, *, require_guard: bool = False) -> int:
        """Bind, start serving, wait until uvicorn is up; returns the bound port.
        `require_guard`: raise RuntimeError, before binding anything, unless the protocol that
        keeps capture.guard's read times will serve."""
        protocol = self._protocol()
        self.guarded = isinstance(protocol, type) and issubclass(protocol, FastLaneProtocol)
        if require_guard and not self.guarded:
            raise RuntimeError(
                f"refusing to serve on the public address {self.host}: the server cannot run "
                "the protocol that bounds header and body read times (capture.guard; it needs "
                "httptools and a uvicorn capture.fast_lane was read against, see the warning "
                "logged above). Install those, or bind 127.0.0.1 behind a tunnel.")
        self._sockets = [bind(self.host, self.port)]
        self.port = self._sockets[0].getsockname()[1]
        if self.also is not None:
            try:
                self._sockets.append(bind(*self.also))
            except OSError:
                self._sockets[0].close()
                raise
            self.also_port = self._sockets[1].getsockname()[1]
        config = uvicorn.Config(
            self.app,
            loop=fast_loop(),
            http=protocol,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_keep_alive=120,
            # X-Forwarded-* from a local client would be believed by default; nothing here reads
            # the client address, and the middleware is one more layer on every call.
            proxy_headers=False,
            backlog=2048,
            # capture.guard: past it, a request is answered 503 (uvicorn's own check)
            limit_concurrency=self.limits.max_connections if self.limits is not None else None,
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
        return fast_lane_protocol(*self.fast_lane, limits=self.limits) or fast_http()

    def _serve(self) -> None:
        assert self._server is not None and self._sockets
        serve = self._server.serve(sockets=self._sockets)
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
        for sock in self._sockets:
            sock.close()
        self._sockets = []
        self._server = self._thread = None
