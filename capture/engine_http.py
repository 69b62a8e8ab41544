"""The HTTP/1.1 client of the engine leg: keep-alive connections to one engine, parsed by httptools.

Why not aiohttp (which the proxy used before): the engine leg is on every call's critical path,
and measured on this 2-core machine with a 31 KB request and a 44 KB reply, a bare relay built on
aiohttp's client spent 1.5-1.8 ms of CPU per call against 0.9-1.1 ms for the same relay on an
asyncio protocol fed to httptools (the llhttp parser uvicorn itself uses). That half millisecond
was a third of the proxy's whole added latency. The client needs none of what aiohttp's costs pay
for (cookies, redirects, auth, proxies, TLS, compression, tracing): one plain-HTTP engine, JSON
in, JSON or SSE out.

What it does own, and how:
  * Keep-alive: idle connections are reused last-in first-out, and only while younger than
    `IDLE_S` (4 s), under the 5 s after which vLLM's uvicorn closes an idle connection, so a
    request is not written to a connection the engine is closing. If a reused connection still
    dies before a single byte of the reply, the request is sent once more on a new connection:
    the engine closed it unread (a request it had read would have had an answer or an error).
  * Timeouts: `connect_timeout_s` to connect; `read_timeout_s` is the longest the engine may stay
    silent while a reply is owed (before its headers, or between two pieces of its body), not
    counting time the socket is paused for a slow consumer. It is one timer per connection that
    moves its own deadline when it fires, not a timer per read: `asyncio.timeout` around every
    wait cost ~3% of the proxy's CPU per call here, for a deadline that almost never fires.
  * Back-pressure: a streamed reply the consumer is slow to take pauses the socket at `HIGH_WATER`
    buffered bytes and resumes when the consumer takes them, so a slow agent never makes the proxy
    buffer a stream.
  * A reply read whole (`request(..., whole=True)`, every non-streamed call) wakes its caller once,
    when it is complete: an engine on uvicorn writes a reply's head and body apart, and waking at
    the head to wait again for the body cost a loop turn and a task step per call.
  * Errors leave as OSError subclasses (ConnectionRefusedError, ConnectionResetError, ...) and
    TimeoutError; `upstream.py` maps them to the capture's error tree in one place.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import time
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

__all__ = ["EngineHTTP", "EngineReply"]

IDLE_S = 4.0
HIGH_WATER = 1 << 20  # buffered reply bytes before the socket is paused


class EngineReply:
    """One reply: its status once the headers are in, then its body, whole or as it arrives."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self.status = 0
        self.headers: dict[bytes, bytes] = {}

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool. (A loop, not `iter_any`: every
        async generator asyncio sees is added to and removed from a WeakSet, on every call.)"""
        connection = self._connection
        parts = []
        try:
            while (data := await connection.next_body()) is not None:
                parts.append(data)
        finally:
            self.release()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body in pieces, each whatever had arrived when the consumer asked. However it
        ends, the connection is given back (finished) or closed (not)."""
        connection = self._connection
        try:
            while True:
                data = await connection.next_body()
                if data is None:
                    return
                yield data
        finally:
            self.release()

    def release(self) -> None:
        """Return a finished reply's connection to the pool; close one that is not finished.

        Only while the connection is still this reply's: a consumer that stops iterating at the
        reply's end leaves `iter_any` suspended, and Python finalises it whenever the generator
        is collected, by which time the connection may be carrying another request. Releasing it
        then would close that request's connection, or pool it twice."""
        if self._connection.reply is self:
            self._connection.release()


class _Connection(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self, pool: EngineHTTP) -> None:
        self._pool = pool
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.reply: EngineReply | None = None  # the request in flight, or the last one
        self._ready: asyncio.Future[None] | None = None  # what `replied` waits for
        self._whole = False  # the request's caller waits for the whole reply, not its headers
        self._headers_in = False
        self._body: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._wake: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._until_eof = False
        self._keep_alive = False
        self._silent_since = 0.0  # loop time of the request or of the last byte of its reply
        self._watchdog: asyncio.TimerHandle | None = None
        self.complete = False
        self.closed = False
        self.got_bytes = False
        self.idle_since = 0.0
        self.released = True

    # --- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.released:  # bytes nobody asked for, on an idle connection: not to be trusted
            self.close()
            return
        self.got_bytes = True
        self._silent_since = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionResetError(f"engine sent an invalid HTTP reply: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self.reply is not None and not self.complete:
            if self._until_eof and exc is None and self._headers_in:
                self.on_message_complete()  # a reply delimited by the end of the connection
            else:
                self._fail(exc or ConnectionResetError("engine closed the connection mid-reply"))

    def pause_writing(self) -> None:
        # A request is already whole in memory; the transport keeps what the socket has not taken
        # yet, so there is nothing upstream of it to slow down.
        pass

    def resume_writing(self) -> None:
        pass

    # --- httptools callbacks ---------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.reply is not None
        self.reply.headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        reply = self.reply
        assert reply is not None and self._ready is not None
        reply.status = self._parser.get_status_code()
        headers = reply.headers
        self._until_eof = (b"content-length" not in headers
                           and b"chunked" not in headers.get(b"transfer-encoding", b"").lower())
        self._headers_in = True
        if not self._whole and not self._ready.done():
            self._ready.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._buffered += len(body)
        # A whole reply is kept in memory anyway, and nobody takes from it until it is complete.
        if (self._buffered > HIGH_WATER and not self._whole and not self._paused
                and self._transport is not None):
            self._paused = True
            self._transport.pause_reading()
        self._wakeup()

    def on_message_complete(self) -> None:
        # Asked here: once the callback returns, llhttp resets its flags for the next message.
        self._keep_alive = self._parser.should_keep_alive()
        self.complete = True
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)
        self._wakeup()

    # --- the request ---------------------------------------------------------------------------
    def send(self, head: bytes, body: bytes | None, whole: bool) -> None:
        assert self._transport is not None
        if self.closed:
            raise ConnectionResetError("engine closed the connection")
        loop = self._loop
        self.reply = EngineReply(self)
        self._ready = loop.create_future()
        self._whole, self._headers_in = whole, False
        self._silent_since = loop.time()
        if self._watchdog is None:
            self._watchdog = loop.call_at(self._silent_since + self._pool.read_timeout_s,
                                          self._watch)
        self.complete = self.got_bytes = self.released = False
        self._until_eof = self._keep_alive = False
        self._body.clear()
        self._buffered = 0
        self._error = None
        # Two buffers, one write (writev): not `head + body`, a copy of the whole history's JSON.
        self._transport.writelines((head, body) if body else (head,))

    async def replied(self) -> EngineReply:
        """The reply, once its status and headers are in (or all of it, for a whole one)."""
        assert self._ready is not None and self.reply is not None
        await self._ready
        return self.reply

    def _watch(self) -> None:
        """The read timeout: fail the reply if the engine has been silent too long, else wait
        until it would have been. An idle connection lets its timer lapse (`send` starts one)."""
        self._watchdog = None
        if self.released or self.complete or self.closed:
            return
        loop = self._loop
        deadline = self._silent_since + self._pool.read_timeout_s
        if self._paused:  # the consumer is slow, not the engine
            deadline = loop.time() + self._pool.read_timeout_s
        elif loop.time() >= deadline:
            self._fail(TimeoutError(
                f"the engine sent nothing for {self._pool.read_timeout_s:g} s"))
            self.close()
            return
        self._watchdog = loop.call_at(deadline, self._watch)

    async def next_body(self) -> bytes | None:
        """The body bytes that arrived since the last call; None once the reply is complete."""
        while not self._body:
            if self._error is not None:
                raise self._error
            if self.complete:
                self.release()
                return None
            self._wake = self._loop.create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        data = self._body.popleft() if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
        self._buffered = 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._silent_since = self._loop.time()  # owed again from now, not from the pause
            self._transport.resume_reading()
        return data

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self._error is not None:  # the first cause is the one to report
            return
        self._error = error
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: a failure nobody awaited is not logged
        self._wakeup()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        reusable = self.complete and self._keep_alive and not self.closed and not self._until_eof
        if reusable:
            self.idle_since = time.monotonic()
            self._pool.put_back(self)
        else:
            self.close()
        self._pool.slot_free()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()


class EngineHTTP:
    """A pool of keep-alive connections to one engine; `for_url` makes one from its root URL."""

    def __init__(self, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                 prefix: str = "", connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0, max_connections: int = 512) -> None:
        self.host, self.port = host, port
        self.tls = tls
        self.prefix = prefix.rstrip("/")  # an engine behind a reverse proxy's path
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._host_header = (f"[{host}]:{port}" if ":" in host else f"{host}:{port}").encode()
        self.opened = 0  # connections opened (a reused one is not counted again)

    @classmethod
    def for_url(cls, url: str, **options: float | int) -> EngineHTTP:
        """`http(s)://host[:port][/prefix]`; https verifies the engine's certificate."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL {url!r} must be http://host[:port] or https://...")
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        port = parts.port or (443 if tls else 80)
        return cls(parts.hostname, port, tls=tls, prefix=parts.path, **options)  # type: ignore[arg-type]

    async def request(self, method: str, path: str, body: bytes | None = None,
                      content_type: bytes = b"application/json", *, whole: bool = False
                      ) -> EngineReply:
        """Send one request; returns once the reply's headers are in, or with `whole` once all of
        it is (its `read()` then does not wait). Read or release the reply.

        `whole` is for a reply the caller reads whole anyway: its task wakes once, when the reply
        is complete, not at the headers and again at the body (a server such as uvicorn writes
        them apart); measured here, that second wake-up was ~0.05 ms of CPU on the call's path."""
        head = b"".join([method.encode(), b" ", (self.prefix + path).encode(), b" HTTP/1.1\r\nhost: ",
                         self._host_header, b"\r\naccept: */*\r\n"])
        if body is not None:
            head += (b"content-type: " + content_type + b"\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\n")
        head += b"\r\n"
        await self._slots.acquire()
        try:
            connection, reused = self._take_idle(), True
            if connection is None:
                connection, reused = await self._open(), False
            try:
                connection.send(head, body, whole)
                return await connection.replied()
            except (ConnectionError, OSError) as exc:
                connection.close()
                if not reused or connection.got_bytes or isinstance(exc, TimeoutError):
                    raise
            except BaseException:  # cancelled while waiting: the reply would arrive to no one
                connection.close()
                raise
            # the engine closed the reused connection without reading the request: once more
            connection = await self._open()
            try:
                connection.send(head, body, whole)
                return await connection.replied()
            except BaseException:
                connection.close()
                raise
        except BaseException:
            self._slots.release()
            raise

    def _take_idle(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and now - connection.idle_since < IDLE_S:
                return connection
            connection.close()
        return None

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout_s):
            _, connection = await loop.create_connection(
                lambda: _Connection(self), self.host, self.port, ssl=self.tls)
        self.opened += 1
        return connection

    def put_back(self, connection: _Connection) -> None:
        self._idle.append(connection)

    def slot_free(self) -> None:
        self._slots.release()

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

