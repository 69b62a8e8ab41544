"""Serve an ASGI app with uvicorn in a background thread, on a socket bound by the caller.

Used by CaptureServer, the fake engine, the scripted test engine and the bench's relay. The socket
is bound before the thread starts so the port (`0` = any free one) is known when `start()` returns
and a bind error is raised in the caller's thread. Only uvicorn's public interface is used:
`uvicorn.Config` and `uvicorn.Server.serve(sockets=...)`. uvloop and httptools are used when
installed (uvicorn's `loop=` option, and its `http="auto"` picks httptools): they halve uvicorn's
per-request CPU. With `limits`, the server runs capture.guard's `server_options`: uvicorn's h11
protocol (which bounds a head's bytes) behind `GuardedHTTP`'s clock, and uvicorn's own
`limit_concurrency`; servers without `limits` (test engines) keep httptools. One
server may listen on more than one address (the proxy's admin listener).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from .guard import read_body, server_options
from .state import Limits

__all__ = ["ThreadedUvicorn", "fast_loop", "read_body"]


def fast_loop() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return "asyncio"
    return "uvloop"


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

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, *,
                 limits: Limits | None = None, also: tuple[str, int] | None = None) -> None:
        """`limits`: capture.guard's bounds (connections, head time and size; the app keeps the
        rest); `also`: a second address (host, port) served by the same server (`also_port`
        once started)."""
        self.app = app
        self.limits = limits
        self.host = host
        self.port = port
        self.also = also
        self.also_port: int | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sockets: list[socket.socket] = []

    def start(self, timeout_s: float = 30.0) -> int:
        """Bind, start serving, wait until uvicorn is up; returns the bound port."""
        # Made before binding: if capture.guard cannot run, nothing is bound (RuntimeError).
        guarded: dict[str, Any] = (server_options(self.limits) if self.limits is not None
                                   else {"http": "auto"})
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
            **guarded,
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
