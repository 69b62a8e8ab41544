"""uvicorn's HTTP protocol, with a fast lane for the requests an app claims (the model calls).

Why: uvicorn serves every request through a per-request ASGI cycle: an object, an event, a
`receive` that copies the body, a `send` that validates and writes the head, then writes the body
in a second write (so the agent's client wakes twice). On this machine that is 0.15-0.2 ms of CPU
per call on the path the agent waits on, a quarter of what the capture adds to a call (bench/capture:
a relay on a bare httptools protocol against the same relay as a plain ASGI app on uvicorn).

How: the parsing, connections, keep-alive, timeouts, flow control, start-up and shutdown stay
uvicorn's: this is its httptools protocol (`uvicorn.Config(http=...)` is where a server picks its
protocol class), with three parser callbacks extended. When a request's head is complete and the
app claims its path (`app.fast_lane(path)` returns an ASGI handler: the capture's model-call
routes, POST only), the body is collected here and the handler runs with a `receive` that hands
it over whole and a `send` that writes straight to the socket, the head and a whole body in one
write. The handler's task is started eagerly, inside the parser callback that completed the
request, so it runs up to its first wait (the engine's reply) at once, not one loop turn later.
Anything unusual about a request (`Expect: 100-continue`, a declared body over the limit, a
percent-encoded path, a root path, an upgrade, a request pipelined behind another) is left to
uvicorn's own path, which serves it exactly as before; so is every request the app does not claim.

The public-port checks (capture.guard) are called from here, and only called: a claimed request's
handler may carry a `precheck(headers)` (the session key, from the head alone) whose refusal is
written before any of the body is read; every connection's head and body read times and its head's
size are kept by a `guard.ConnectionGuard`; a request past uvicorn's `limit_concurrency` is left
to uvicorn's own 503.

The subclass leans on attributes of uvicorn's protocol that are not its public API (read against
uvicorn 0.54; the same since 0.40). `fast_lane_protocol` checks the installed uvicorn is in that
range and has them, and otherwise says so in the log and returns None: the server then runs on
uvicorn's plain protocol, slower by the figure above, never wrong. tests/test_capture_fast_lane.py
holds the lane to HTTP/1.1's rules (keep-alive, pipelining, chunked bodies, HTTP/1.0, hang-ups).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .guard import DRAIN_BYTES, ConnectionGuard, Limits

__all__ = ["FastLaneHandler", "fast_lane_protocol"]

logger = logging.getLogger(__name__)

FastLaneHandler = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class _InFlight:
    """Stands in for uvicorn's cycle while a fast-lane call is served: uvicorn queues a request
    pipelined behind it (`response_complete` is False) and starts it when the call is answered."""

    response_complete = False
    disconnected = False
    keep_alive = True

    def __init__(self) -> None:
        self.message_event = asyncio.Event()


class _Call:
    """One fast-lane request: its body, then its response written to the transport."""

    __slots__ = ("body", "chunked", "complete", "disconnect", "handler", "head", "keep_alive",
                 "left", "limit", "protocol", "refused", "scope", "size", "started")

    def __init__(self, protocol: FastLaneProtocol, handler: FastLaneHandler,
                 scope: dict[str, Any], keep_alive: bool, limit: int) -> None:
        self.protocol, self.handler, self.scope = protocol, handler, scope
        self.keep_alive, self.limit = keep_alive, limit
        self.body: list[bytes] = []
        self.size = 0
        self.head: bytes | None = None
        self.started = self.chunked = self.complete = self.left = False
        self.disconnect: asyncio.Future[None] | None = None
        self.refused = False  # answered from its head (capture.guard): its body is dropped

    def add(self, chunk: bytes) -> None:
        if self.refused:
            self.size += len(chunk)
            if self.size > DRAIN_BYTES:
                self.protocol.transport.close()
            return
        # Past the limit the rest is dropped: the handler sees limit + 1 bytes and refuses (413).
        if self.size <= self.limit:
            self.body.append(chunk[: self.limit + 1 - self.size])
        self.size += len(chunk)

    async def receive(self) -> dict[str, Any]:
        if self.body is not None:
            body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            self.body = None  # type: ignore[assignment]
            return {"type": "http.request", "body": body, "more_body": False}
        if not (self.left or self.complete):
            if self.disconnect is None:
                self.disconnect = asyncio.get_running_loop().create_future()
            await self.disconnect
        return {"type": "http.disconnect"}

    def hang_up(self) -> None:
        self.left = True
        if self.disconnect is not None and not self.disconnect.done():
            self.disconnect.set_result(None)

    async def send(self, message: dict[str, Any]) -> None:
        protocol = self.protocol
        if protocol.flow.write_paused and not self.left:
            await protocol.flow.drain()
        if self.left:
            return
        if message["type"] == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            head = [STATUS_LINE[message["status"]]]
            framed = False
            for name, value in (*protocol.server_state.default_headers,
                                *message.get("headers", ())):
                framed = framed or name.lower() in (b"content-length", b"transfer-encoding")
                head += (name, b": ", value, b"\r\n")
            if not self.keep_alive:
                head.append(b"connection: close\r\n")
            if not framed:
                self.chunked = True
                head.append(b"transfer-encoding: chunked\r\n")
            head.append(b"\r\n")
            if self.chunked:  # a stream: its head goes now, whenever its first event comes
                protocol.transport.write(b"".join(head))
            else:  # a whole body follows at once: one write for both
                self.head = b"".join(head)
            return
        if message["type"] != "http.response.body" or not self.started or self.complete:
            raise RuntimeError(f"unexpected ASGI message {message['type']!r}")
        body: bytes = message.get("body", b"")
        more = message.get("more_body", False)
        parts = [] if self.head is None else [self.head]
        self.head = None
        if self.chunked:
            if body:
                parts += (b"%x\r\n" % len(body), body, b"\r\n")
            if not more:
                parts.append(b"0\r\n\r\n")
        elif body:
            parts.append(body)
        # One write for the head and a whole body: the agent's client wakes once.
        if len(parts) == 1:
            protocol.transport.write(parts[0])
        elif parts:
            protocol.transport.write(b"".join(parts))
        if not more:
            self.complete = True
            if self.disconnect is not None and not self.disconnect.done():
                self.disconnect.set_result(None)


class FastLaneProtocol(HttpToolsProtocol):
    """See the module docstring. `claim` and `limit` are bound by `fast_lane_protocol`."""

    claim: Callable[[str], FastLaneHandler | None]
    limit: int
    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._call: _Call | None = None  # the fast-lane call being received or served
        self._receiving = False  # the parser is inside that call's request
        self._clock: ConnectionGuard | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._clock = ConnectionGuard(self, self.limits)
        self._clock.opened()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._clock is not None:  # counted once parsed: a head still open after it grows
            self._clock.received(len(data))

    def responding(self) -> bool:
        """Whether a response on this connection is under way (no 408 or 431 into it)."""
        if self._call is not None and (self._call.refused or not self._receiving):
            return True
        return self.cycle is not None and not self.cycle.response_complete

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._clock is not None:
            self._clock.head_started()

    def on_headers_complete(self) -> None:
        if self._clock is not None:
            self._clock.head_done()
        call = self._claimed()
        if call is not None and call.refused:
            self._call, self._receiving = call, True
            return
        if call is None:
            if self._call is not None:  # pipelined behind a call in the fast lane: uvicorn queues it
                self.cycle = _InFlight()  # type: ignore[assignment]
            super().on_headers_complete()
            return
        self._call, self._receiving = call, True

    def _claimed(self) -> _Call | None:
        parser = self.parser
        if (parser.get_method() != b"POST" or self.expect_100_continue or self._call is not None
                or (self.cycle is not None and not self.cycle.response_complete)
                or self.root_path or parser.should_upgrade()):
            return None
        raw_path, _, query = self.url.partition(b"?")
        if b"%" in raw_path or not raw_path.isascii():
            return None
        path = raw_path.decode("ascii")
        handler = self.claim(path)
        if handler is None:
            return None
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            return None  # uvicorn's path answers 503
        precheck = getattr(handler, "precheck", None)
        refusal = precheck(self.headers) if precheck is not None else None
        if refusal is not None:  # answered now, before any body byte is read (capture.guard)
            self.transport.write(refusal)
            declared = next((v for n, v in self.headers if n == b"content-length"), b"")
            if not declared.isdigit() or int(declared) > DRAIN_BYTES:
                self.transport.close()  # a body it will not drain: closed at once
            call = _Call(self, handler, self.scope, False, self.limit)
            call.refused = True
            return call
        for name, value in self.headers:
            if name == b"content-length" and (not value.isdigit() or int(value) > self.limit):
                return None  # uvicorn's path answers it (413, or its parser's 400)
        scope = self.scope
        version = parser.get_http_version()
        scope.update(method="POST", path=path, raw_path=raw_path, query_string=query)
        if version != "1.1":
            scope["http_version"] = version
        keep_alive = version != "1.0" and parser.should_keep_alive()
        return _Call(self, handler, scope, keep_alive, self.limit)

    def on_body(self, body: bytes) -> None:
        if self._receiving:
            self._call.add(body)  # type: ignore[union-attr]
        else:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._clock is not None:
            self._clock.body_done()
        if not self._receiving:
            super().on_message_complete()
            return
        self._receiving = False
        if self._call is not None and self._call.refused:  # its answer is out: close
            self._call = None
            self.transport.close()
            return
        # Started eagerly: the handler runs now, inside this parser callback, up to its first wait
        # (the engine's reply), instead of one loop iteration later.
        task = asyncio.Task(self._serve(self._call), loop=self.loop,  # type: ignore[arg-type]
                            eager_start=True)
        if not task.done():
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)

    async def _serve(self, call: _Call) -> None:
        try:
            await call.handler(call.scope, call.receive, call.send)
        except Exception as exc:  # as uvicorn's cycle does: a 500 if nothing was sent, then close
            logger.error("fast-lane request %s failed", call.scope.get("path"), exc_info=exc)
            if not call.started and not call.left:
                self.transport.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: "
                                     b"text/plain; charset=utf-8\r\ncontent-length: 21\r\n"
                                     b"connection: close\r\n\r\nInternal Server Error")
            call.keep_alive = False
        finally:
            self._call = None
            if isinstance(self.cycle, _InFlight):
                self.cycle = None  # type: ignore[assignment]
            if not call.complete or not call.keep_alive:
                self.transport.close()
            else:
                self.on_response_complete()  # uvicorn: start a queued request, or arm keep-alive

    def connection_lost(self, exc: Exception | None) -> None:
        if self._clock is not None:
            self._clock.stop()
        if self._call is not None:
            self._call.hang_up()
        super().connection_lost(exc)

    def shutdown(self) -> None:
        if self._call is not None:  # close once its response is out, as uvicorn does for a cycle
            self._call.keep_alive = False
            return
        super().shutdown()


# uvicorn versions whose protocol internals the lane was read against, and what it uses of them.
UVICORN_TESTED = ((0, 40), (0, 55))
_USES = ("on_message_begin", "on_url", "on_header", "on_headers_complete", "on_body",
         "on_message_complete", "on_response_complete", "connection_lost", "shutdown",
         "data_received", "pause_writing", "resume_writing", "connection_made")


def fast_lane_protocol(claim: Callable[[str], FastLaneHandler | None], limit: int,
                       uvicorn_version: str | None = None, limits: Limits | None = None
                       ) -> type[FastLaneProtocol] | None:
    """uvicorn's httptools protocol with `claim(path)`'s POSTs served in the fast lane, their
    bodies capped at `limit` bytes (a larger declared body is left to the app's own 413), and
    `limits`' read times kept on every connection (capture.guard); None (and a warning) when the
    installed uvicorn is not one the lane was read against."""
    version = uvicorn_version or uvicorn.__version__
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        found = (-1, -1)
    low, high = UVICORN_TESTED
    missing = [name for name in _USES if not hasattr(HttpToolsProtocol, name)]
    if not low <= found < high or missing:
        logger.warning("capture's fast lane is off: uvicorn %s is not one it was read against "
                       "(>=%d.%d,<%d.%d)%s; model calls take uvicorn's plain path, ~0.1 ms slower",
                       version, *low, *high, f", it lacks {missing}" if missing else "")
        return None
    return type("FastLaneProtocol", (FastLaneProtocol,), {
        "claim": staticmethod(claim), "limit": limit, "limits": limits or Limits()})
