"""Safe on a public port: every check that stands between the socket and a session, in one place.

The HF Jobs launcher binds the proxy on 0.0.0.0 and exposes it, so anyone who can reach the port
can send it bytes. What the proxy promises to such a peer, and where each promise is kept:

    the session key first   a model call is admitted (`admit`: the session exists, the key is its
                            own, the session is under its memory bound) from its HEAD alone,
                            before any byte of its body is read: the fast lane asks `admit` when
                            the head is complete and answers a refusal at once
                            (`refusal_bytes`, `connection: close`; the body that follows is
                            discarded, at most DRAIN_BYTES of it, never kept); uvicorn's own path
                            calls the same `admit` before `receive()`
    bounded connections     `Limits.max_connections` open connections (uvicorn's
                            `limit_concurrency`, its public setting): past it a request is answered
                            503; the fast lane defers to uvicorn's check (`over_capacity`)
    header read time        `Limits.header_timeout_s` from a connection's opening (or a request's
                            first byte) to its complete head; past it: 408 and the connection
                            closes (a slowloris peer holds a connection that long at most)
    header size             `Limits.max_header_bytes` received before a head is complete; past
                            it: 431, closed (the HTTP parser itself has no bound)
    body read time          `Limits.body_timeout_s` from the complete head to the complete body;
                            past it: 408, closed
    body size               `Limits.max_body_bytes` (413, before the body is read when declared)
    memory per session      `Limits.max_session_bytes` of recorded token arrays (the part of a
                            session that grows with its calls; the caches beside it are bounded
                            by a few request bodies): past it each new call is refused with 413
                            and a message saying the rollout should end
    admin routes            served on the public listener only when asked
                            (`CaptureServer(admin_on_public=True)`); otherwise on their own
                            listener on 127.0.0.1 (`CaptureServer.admin_url`)

The timers and the header count (`ConnectionGuard`) are driven by the server's HTTP protocol
(capture.fast_lane calls them from its parser callbacks); a server that cannot run that protocol
refuses to bind a non-loopback address (capture.server) rather than serve a public port without
them.
"""

from __future__ import annotations

import asyncio
import http
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import BadRequest

if TYPE_CHECKING:
    from .app import CaptureState
    from .sessions import Session

__all__ = ["DRAIN_BYTES", "ConnectionGuard", "Limits", "admit", "presented_key",
           "refusal_bytes"]

# How much of a refused request's body is read (and dropped) before its connection is closed:
# enough that a client with a wrong key reads its 401 rather than a reset, no more.
DRAIN_BYTES = 64 * 1024

Headers = list[tuple[bytes, bytes]]  # an ASGI scope's: names lowercased (uvicorn does)


@dataclass(frozen=True)
class Limits:
    """The proxy's bounds on what a peer can hold (module docstring)."""

    max_connections: int = 2048
    header_timeout_s: float = 30.0
    body_timeout_s: float = 120.0
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 32 * 1024 * 1024
    max_session_bytes: int = 512 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "header_timeout_s", "body_timeout_s", "max_header_bytes",
                     "max_body_bytes", "max_session_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")


def header(headers: Headers, name: bytes) -> str | None:
    """The first value of header `name` (as Starlette's `Headers.get` would give it)."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def presented_key(headers: Headers) -> str | None:
    """The secret an agent SDK sends: `Authorization: Bearer <key>` or `x-api-key`."""
    auth = header(headers, b"authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return header(headers, b"x-api-key")


def admit(state: CaptureState, session_id: str, headers: Headers) -> Session:
    """The session a model call may use, decided from its head alone: UnknownSession (404),
    BadSessionKey (401), or BadRequest (413) for a session over its memory bound."""
    session = state.store.get(session_id)
    session.check_key(presented_key(headers))
    bound = state.limits.max_session_bytes
    if session.token_bytes >= bound:
        raise BadRequest(
            f"session {session_id} holds {session.token_bytes} bytes of recorded tokens, the "
            f"proxy's bound per session is {bound} (max_session_bytes): end this rollout",
            status=413)
    return session


def _response(status: int, content_type: bytes, data: bytes) -> bytes:
    phrase = http.HTTPStatus(status).phrase.encode()
    return b"".join((b"HTTP/1.1 %d %s\r\n" % (status, phrase), b"content-type: ", content_type,
                     b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(data), data))


def refusal_bytes(status: int, body: dict[str, Any]) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection (sent before a body is read)."""
    return _response(status, b"application/json", json.dumps(body).encode())


_TIMEOUT = _response(408, b"text/plain; charset=utf-8",
                     b"the request was not received in time (capture proxy read timeout)")
_TOO_LARGE = _response(431, b"text/plain; charset=utf-8",
                       b"request head too large (capture proxy max_header_bytes)")


class ConnectionGuard:
    """One connection's bounds: its head within `header_timeout_s` and `max_header_bytes`, then
    its body within `body_timeout_s`. Past a time, the connection gets 408 (when no response of
    its is under way) and is closed; past the size, 431. The protocol calls `opened` (connection
    made), `head_started` (a request's first byte), `received` (after each read is parsed),
    `head_done`, `body_done` and `stop` (connection lost)."""

    __slots__ = ("_handle", "_head_bytes", "_in_head", "_limits", "_loop", "_protocol")

    def __init__(self, protocol: Any, limits: Limits) -> None:
        self._protocol, self._limits = protocol, limits
        self._loop = asyncio.get_running_loop()
        self._handle: asyncio.TimerHandle | None = None
        self._in_head, self._head_bytes = False, 0

    def received(self, size: int) -> bool:
        """`size` bytes were parsed; if a head is still incomplete after them they count towards
        it, and past `max_header_bytes` the connection is answered 431 and closed (False). A read
        in which a head completed is not counted, so a body sent with its head never is."""
        if not self._in_head:
            return True
        self._head_bytes += size
        if self._head_bytes <= self._limits.max_header_bytes:
            return True
        self.stop()
        transport = self._protocol.transport
        if not transport.is_closing():
            if not self._protocol.responding():
                transport.write(_TOO_LARGE)
            transport.close()
        return False

    def _arm(self, seconds: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = self._loop.call_later(seconds, self._expired)

    def opened(self) -> None:
        """A connection opened: its first head is due within the header time."""
        self._arm(self._limits.header_timeout_s)

    def head_started(self) -> None:
        """A request's first byte arrived (a new connection's deadline runs from its opening)."""
        self._in_head, self._head_bytes = True, 0
        if self._handle is None:
            self._arm(self._limits.header_timeout_s)

    def head_done(self) -> None:
        self._in_head = False
        self._arm(self._limits.body_timeout_s)

    def body_done(self) -> None:
        self.stop()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expired(self) -> None:
        self._handle = None
        transport = self._protocol.transport
        if transport.is_closing():
            return
        if not self._protocol.responding():
            transport.write(_TIMEOUT)
        transport.close()
