"""Safe on a public port: every check that stands between the socket and a session, in one place.

The HF Jobs launcher binds the proxy on 0.0.0.0 and exposes it, so anyone who can reach the port
can send it bytes. What the proxy promises to such a peer, and where each promise is kept (all of
it here; the proxy's app calls `Gate` first for every request, the server runs uvicorn's h11
protocol with `server_options` behind `GuardedHTTP`'s clock; `harness.serve` runs the same server
options and `guard_app`, which is `Gate` without the sessions):

    the session key first   a request under /s/{id}/ is admitted (`admit`: the session exists, the
                            key is its own, and for a model call the session is under its memory
                            bound) and an /admin request's admin key checked (`check_admin`) from
                            its HEAD alone: `Gate` runs when uvicorn has parsed the head and before
                            the app calls `receive()`, so a refusal (401, 404, 413) is decided
                            before any body byte is taken, and answered with `connection: close`.
                            What uvicorn (0.55, h11) does meanwhile: it sends
                            no `100 Continue` until the app first calls `receive()` (a refused
                            request never does), and it buffers the body bytes that arrive
                            meanwhile, pausing the socket once past its flow-control high water
                            (64 KiB, so at most that plus one socket read); a refused request's
                            buffer is dropped with its connection, never parsed or kept.
    bounded connections     `Limits.max_connections` open connections and requests (uvicorn's
                            `limit_concurrency`, its public setting): past it a request is answered
                            503 by uvicorn.
    requests per session    `Limits.max_session_requests` requests of one session in flight at
                            once (`Gate`, from the head): past it 429, so one rollout cannot hold
                            the connections every other session needs.
    header read time        `Limits.header_timeout_s` from a connection's opening (or a later
                            request's first byte) to the request reaching the app; past it: 408
                            and the connection closes (a slowloris peer holds a connection that
                            long at most). uvicorn has no public setting for it
                            (`timeout_keep_alive` bounds only the idle time after a response), so
                            `GuardedHTTP` keeps a clock; it reads no byte.
    header size             `Limits.max_header_bytes`: h11's own bound on an incomplete event
                            (uvicorn's `h11_max_incomplete_event_size`): past it uvicorn answers
                            400 and closes. A head pipelined behind a request in flight is not
                            parsed until that request ends: h11 pauses, uvicorn stops reading the
                            socket, so it holds one socket read at most (the kernel's buffers
                            hold the rest). httptools, uvicorn's faster parser, has no bound, so
                            the guarded server always runs h11.
    body read time          `Limits.body_timeout_s` from the complete head to the complete body;
                            past it: 408, closed (`Gate`'s `receive`).
    body size               `Limits.max_body_bytes`: 413 from the head when the declared length is
                            over it, else once the bytes taken pass it (`Gate`'s `receive`).
    bodies per session      `Limits.max_session_body_bytes` of body bytes held by one session's
                            requests in flight together (a request holds its body until it is
                            answered): past it 413 (`Gate`'s `receive`).
    memory per session      `Limits.max_session_bytes` of recorded token arrays (the part of a
                            session that grows with its calls; the caches beside it are bounded
                            by a few request bodies): past it each new call is refused with 413
                            and a message saying the rollout should end.
    admin routes            served on the public listener only when asked
                            (`CaptureServer(admin_on_public=True)`); otherwise on their own
                            listener on 127.0.0.1 (`CaptureServer.admin_url`), and answered 404 on
                            the public one.

`GuardedHTTP` wraps (never subclasses) uvicorn's h11 protocol and talks to it only through
asyncio.Protocol's interface; it is handed to uvicorn through `uvicorn.Config(http=...)`, which
takes a protocol class. It parses nothing: an earlier version found heads' ends itself in front of
httptools, and a head pipelined behind a call in flight went unbounded (400 MiB accepted).
"""

from __future__ import annotations

import asyncio
import hmac
import http
import weakref
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse

from .dialects import DIALECTS
from .errors import BadRequest, BadSessionKey, CaptureError, NothingTrainableError
from .state import Limits  # the bounds the guard enforces; importable from here too

if TYPE_CHECKING:
    from .dialects.base import Dialect, DialectError
    from .sessions import Session
    from .state import CaptureState

__all__ = ["Gate", "GuardedHTTP", "Limits", "SessionLoad", "admit", "check_admin",
           "error_response", "guard_app", "guarded_protocol", "header", "presented_key",
           "read_body", "server_options"]

Headers = list[tuple[bytes, bytes]]  # an ASGI scope's: names lowercased (uvicorn does)

# The routes under /s/{id}/ that are model calls (POST), and the dialect whose error shape each
# path under /s/{id}/ answers in.
MODEL_CALLS = ("v1/chat/completions", "v1/responses", "v1/messages")
_SHAPES = {"v1/chat/completions": "chat", "v1/responses": "responses", "v1/messages": "messages",
           "v1/messages/count_tokens": "messages", "v1/models": "chat", "": "messages"}
SESSION = "capture.session"  # the scope key `Gate` leaves the admitted session under


# --- what a head says -------------------------------------------------------------------------
def header(headers: Headers, name: bytes) -> str | None:
    """The first value of header `name` (as Starlette's `Headers.get` would give it)."""
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


def presented_key(headers: Headers) -> str | None:
    """The key a client sends: `Authorization: Bearer <key>` (agent SDKs, the admin client) or
    `x-api-key` (Anthropic's SDKs)."""
    auth = header(headers, b"authorization")
    if auth and auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    return header(headers, b"x-api-key")


def admit(state: CaptureState, session_id: str, headers: Headers, model_call: bool = True
          ) -> Session:
    """The session a request may use, decided from its head alone: UnknownSession (404),
    BadSessionKey (401), or for a model call BadRequest (413) for a session over its memory
    bound."""
    session = state.store.get(session_id)
    session.check_key(presented_key(headers))
    bound = state.limits.max_session_bytes
    if model_call and session.token_bytes >= bound:
        raise BadRequest(
            f"session {session_id} holds {session.token_bytes} bytes of recorded tokens, the "
            f"proxy's bound per session is {bound} (max_session_bytes): end this rollout",
            status=413)
    return session


def check_admin(state: CaptureState, headers: Headers) -> None:
    """BadSessionKey (401) unless the head carries the admin key."""
    key = presented_key(headers) or ""
    if not hmac.compare_digest(key.encode("utf-8", "surrogatepass"), state.admin_key.encode()):
        raise BadSessionKey(
            "admin routes need `Authorization: Bearer <admin key>` (printed by `python -m "
            "capture`, or CaptureServer.admin_key)")


def error_response(error: CaptureError | DialectError, dialect: Dialect | None = None,
                   close: bool = False) -> JSONResponse:
    """A failure as the client expects it: in the agent's dialect's error shape, or for the
    admin routes (`dialect` None) `{"error": {type, message}}` (+ `reasons` for a 409).
    `close`: the connection closes after it (a refusal whose body may not have been read)."""
    status = error.status
    if dialect is not None:
        body = dialect.error_body(status, error.message)
    else:
        body = {"error": {"type": type(error).__name__, "message": error.message}}
        if isinstance(error, NothingTrainableError):
            body["reasons"] = error.reasons
    return JSONResponse(body, status_code=status,
                        headers={"connection": "close"} if close else None)


# --- bodies -----------------------------------------------------------------------------------
async def read_body(receive: Any) -> bytes:
    """A request's whole body from an ASGI `receive`: the one body reader of the proxy's routes
    and of the servers beside it (fake engine, bench relay). Under `Gate` the bytes are already
    bounded in size and time; a client that leaves first is a BadRequest."""
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        return message.get("body", b"")  # the common case: the body came whole
    parts = []
    while True:
        if message["type"] == "http.disconnect":
            raise BadRequest("the client closed the connection before its request was whole")
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)
        message = await receive()


# --- the per-request gate -----------------------------------------------------------------------
class Gate:
    """One request through the checks: `Gate.open` decides from the head (a refusal is sent and
    None returned) and otherwise returns the gate, whose `receive` keeps the body's read time and
    size and whose `send` tells the connection's `GuardedHTTP` when the response is complete."""

    __slots__ = ("_clock", "_deadline", "_receive", "_send", "dialect", "done", "limit", "load",
                 "load_limit", "refused", "size", "started")

    def __init__(self, receive: Any, send: Any, limits: Limits, dialect: Dialect | None,
                 clock: GuardedHTTP | None, load: SessionLoad | None = None) -> None:
        self._receive, self._send, self._clock = receive, send, clock
        self.dialect = dialect
        self.limit = limits.max_body_bytes
        self.load, self.load_limit = load, limits.max_session_body_bytes
        self._deadline = asyncio.get_running_loop().time() + limits.body_timeout_s
        self.size = 0
        self.done = self.refused = self.started = False

    @classmethod
    async def open(cls, state: CaptureState, scope: dict[str, Any], receive: Any, send: Any
                   ) -> Gate | None:
        clock = _CONNECTIONS.get((scope.get("server"), scope.get("client")))
        if clock is not None:
            clock.request_started()
        path: str = scope["path"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        headers = scope["headers"]
        dialect = None
        load = None
        try:
            if path.startswith("/s/"):
                session_id, _, rest = path[3:].partition("/")
                dialect = DIALECTS[_SHAPES.get(rest, "chat")]
                session = scope[SESSION] = admit(state, session_id, headers,
                                                 model_call=scope["method"] == "POST"
                                                 and rest in MODEL_CALLS)
                load = SessionLoad.of(session)
                if load.requests >= state.limits.max_session_requests:
                    raise BadRequest(
                        f"session {session_id} has {load.requests} requests in flight, the "
                        f"proxy's bound per session (max_session_requests); retry when one ends",
                        status=429)
            elif path.startswith("/admin"):
                port = state.admin_port
                server = scope.get("server")
                if port is not None and (server is None or server[1] != port):
                    # the public listener of a proxy with an admin listener: as if no such route
                    raise UnknownRoute("not served on this address")
                check_admin(state, headers)
            declared = header(headers, b"content-length")
            limit = state.limits.max_body_bytes
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise BadRequest(f"request body is over the proxy's {limit}-byte limit",
                                 status=413)
        except CaptureError as exc:
            gate = cls(receive, send, state.limits, dialect, clock)
            await gate.refuse(exc)
            return None
        if load is not None:
            load.requests += 1
        return cls(receive, send, state.limits, dialect, clock, load)

    def close(self) -> None:
        """The request is over (answered or failed): its share of its session's load is freed."""
        load, self.load = self.load, None
        if load is not None:
            load.requests -= 1
            load.body_bytes -= self.size

    async def receive(self) -> dict[str, Any]:
        if self.done:  # the body is in: what is left to hear is a disconnect, with no deadline
            return await self._receive()
        if self.refused:
            return {"type": "http.disconnect"}
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            await self.refuse(BadRequest("the request body was not received within the proxy's "
                                         "read time (body_timeout_s)", status=408))
            return {"type": "http.disconnect"}
        if message["type"] == "http.request":
            taken = len(message.get("body", b""))
            self.size += taken
            if self.load is not None:
                self.load.body_bytes += taken
            if self.size > self.limit:
                await self.refuse(BadRequest(
                    f"request body is over the proxy's {self.limit}-byte limit", status=413))
                return {"type": "http.disconnect"}
            if self.load is not None and self.load.body_bytes > self.load_limit:
                await self.refuse(BadRequest(
                    f"the session's requests in flight hold over {self.load_limit} bytes of "
                    "bodies, the proxy's bound per session (max_session_body_bytes)",
                    status=413))
                return {"type": "http.disconnect"}
            self.done = not message.get("more_body", False)
        return message

    async def send(self, message: dict[str, Any]) -> None:
        if self.refused:  # the gate answered; the app's own answer, if any, is dropped
            return
        if message["type"] == "http.response.start":
            self.started = True
        elif not message.get("more_body", False) and self._clock is not None:
            self._clock.response_done()
        await self._send(message)

    async def refuse(self, error: CaptureError) -> None:
        """Answer `error` now, closing the connection, unless a response is already under way."""
        if self.refused or self.started:
            return
        self.refused = True
        response = error_response(error, self.dialect, close=True)
        if self._clock is not None:
            self._clock.response_done()
        await response({"type": "http"}, self._receive, self._send)


class SessionLoad:
    """What one session's requests in flight hold: how many, and their body bytes so far (the
    bounds per session, so one rollout cannot take the connections or memory of all others)."""

    __slots__ = ("body_bytes", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.body_bytes = 0

    @staticmethod
    def of(session: Session) -> SessionLoad:
        load = _LOADS.get(session)
        if load is None:
            load = _LOADS[session] = SessionLoad()
        return load


# Per live session (weakly: a deleted session's entry goes with it).
_LOADS: weakref.WeakKeyDictionary[Any, SessionLoad] = weakref.WeakKeyDictionary()


class UnknownRoute(CaptureError):
    """An admin route asked for on the public listener of a proxy with an admin listener."""

    status = 404


# --- the connection: head time ---------------------------------------------------------------------
def _plain(status: int, text: bytes) -> bytes:
    phrase = http.HTTPStatus(status).phrase.encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (status, phrase, len(text), text))


_TIMEOUT = _plain(408, b"the request was not received in time (capture proxy header_timeout_s)")

# Open guarded connections by (server address, client address): how a request's `Gate` finds its
# connection's clock (uvicorn puts both addresses in the scope, read the same way from the socket).
_CONNECTIONS: dict[tuple[Any, Any], GuardedHTTP] = {}


def _address(info: Any) -> tuple[str, int] | None:
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) and len(info) >= 2 else None


class GuardedHTTP(asyncio.Protocol):
    """uvicorn's h11 protocol (`inner`) with a clock in front of it: a head's read time.

    It parses nothing: h11 (through uvicorn) does, and bounds what it holds. A head is due within
    `header_timeout_s` of the connection's opening, or of the first byte after a response (an
    idle keep-alive connection is uvicorn's `timeout_keep_alive`'s); the clock stops when the
    request reaches the app (`Gate` calls `request_started`). Past it: 408, and the connection
    closes. Made by `guarded_protocol(limits)`, which binds `limits` and the inner class."""

    inner_class: type[asyncio.Protocol]
    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._inner = self.inner_class(*args, **kwargs)
        self._transport: asyncio.Transport | None = None
        self._key: tuple[Any, Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = True  # for a request's head (none of this connection is being served)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._key = (_address(transport.get_extra_info("sockname")),
                     _address(transport.get_extra_info("peername")))
        _CONNECTIONS[self._key] = self
        self._arm()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._waiting and self._timer is None:
            self._arm()  # a later request's first byte
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._key is not None and _CONNECTIONS.get(self._key) is self:
            del _CONNECTIONS[self._key]
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # --- told by Gate -------------------------------------------------------------------------
    def request_started(self) -> None:
        """A request reached the app: its head is complete, no head time runs."""
        self._waiting = False
        self._disarm()

    def response_done(self) -> None:
        """The request's response is complete: the next bytes are a new head's."""
        self._waiting = True

    # --- the clock -------------------------------------------------------------------------------
    def _arm(self) -> None:
        self._disarm()
        self._timer = asyncio.get_running_loop().call_later(self.limits.header_timeout_s,
                                                            self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        transport = self._transport
        if self._waiting and transport is not None and not transport.is_closing():
            transport.write(_TIMEOUT)
            transport.close()


def guarded_protocol(limits: Limits) -> type[GuardedHTTP]:
    """A `GuardedHTTP` class for `uvicorn.Config(http=...)`, in front of uvicorn's h11 protocol
    (h11 bounds a head's bytes, `h11_max_incomplete_event_size`: `server_options`; httptools has
    no such bound). Raises RuntimeError, saying so, if this uvicorn has no h11 protocol."""
    try:
        from uvicorn.protocols.http.h11_impl import H11Protocol
    except ImportError as exc:
        raise RuntimeError(
            "capture.guard cannot find uvicorn's h11 protocol "
            f"(uvicorn.protocols.http.h11_impl.H11Protocol): {exc}; the proxy cannot bound "
            "request heads without it. Install uvicorn with h11.") from exc
    return type("GuardedHTTP", (GuardedHTTP,), {"inner_class": H11Protocol, "limits": limits})


def server_options(limits: Limits) -> dict[str, Any]:
    """The `uvicorn.Config` settings that keep `limits` (with `guarded_protocol` and `guard_app`):
    h11 as the parser, its bound on an incomplete head (`max_header_bytes`: past it uvicorn answers
    400 and closes; a head pipelined behind a request in flight waits in one socket read at most,
    as h11 pauses and uvicorn stops reading), and the connection cap (503 past it)."""
    return {"http": guarded_protocol(limits), "h11_max_incomplete_event_size":
            limits.max_header_bytes, "limit_concurrency": limits.max_connections}


def guard_app(app: Any, limits: Limits) -> Any:
    """`app` behind the guard's checks that need no session (a head's time via the connection's
    clock, a body's size and read time): for a server beside the proxy (`harness.serve`)."""

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        clock = _CONNECTIONS.get((scope.get("server"), scope.get("client")))
        if clock is not None:
            clock.request_started()
        gate = Gate(receive, send, limits, None, clock)
        declared = header(scope["headers"], b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            await gate.refuse(BadRequest(
                f"request body is over the server's {limits.max_body_bytes}-byte limit",
                status=413))
            return
        await app(scope, gate.receive, gate.send)

    return guarded
