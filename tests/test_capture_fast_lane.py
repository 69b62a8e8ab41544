"""The server's fast lane (capture/fast_lane.py): which requests it takes, and HTTP/1.1 kept whole.

A small app claims `/fast` (and `/boom`, which raises) for the fast lane and answers everything
that reaches its own ASGI `__call__` with an `asgi:` prefix, so each test sees which path served a
request. Real uvicorn on a real socket; raw sockets where the client must do what httpx will not
(pipelining, `Expect: 100-continue`, HTTP/1.0, chunked bodies, hanging up mid-call).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from capture.serving import ThreadedUvicorn, read_body

LIMIT = 1024


class LaneApp:
    """Fast lane: POST /fast echoes `fast:<body>`, /slow does so after 50 ms, /stream streams one
    event 0.5 s after its head, /wait waits for the client to leave, /boom raises. Its own ASGI
    path: `asgi:<body>` for anything."""

    def __init__(self) -> None:
        self.left = threading.Event()
        self.first_token = threading.Event()  # the test says when the stream's first event may go

    def fast_lane(self, path: str) -> Any:
        return {"/fast": self.fast, "/slow": self.slow, "/wait": self.wait,
                "/boom": self.boom, "/stream": self.stream}.get(path)

    async def fast(self, scope: dict, receive: Any, send: Any, prefix: bytes = b"fast:") -> None:
        body = (await receive())["body"]
        content = prefix + (str(len(body)).encode() if scope["path"] == "/fast"
                            and scope["query_string"] == b"len" else body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})

    async def slow(self, scope: dict, receive: Any, send: Any) -> None:
        await asyncio.sleep(0.05)
        await self.fast(scope, receive, send)

    async def wait(self, scope: dict, receive: Any, send: Any) -> None:
        await receive()
        assert (await receive())["type"] == "http.disconnect"
        self.left.set()

    async def stream(self, scope: dict, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        # the engine's first token comes only once the test has the head (or after a minute)
        await asyncio.get_running_loop().run_in_executor(None, self.first_token.wait, 60)
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def boom(self, scope: dict, receive: Any, send: Any) -> None:
        raise RuntimeError("a handler bug")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        content = b"asgi:" + await read_body(receive)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})


@pytest.fixture(scope="module")
def lane() -> Iterator[tuple[LaneApp, int]]:
    app = LaneApp()
    server = ThreadedUvicorn(app, fast_lane=(app.fast_lane, LIMIT))
    port = server.start()
    yield app, port
    server.stop()


def raw_exchange(port: int, data: bytes, until: bytes, timeout_s: float = 5.0) -> bytes:
    """Send `data` on a fresh connection; read until `until` has arrived (or the server closes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        got = b""
        while until not in got:
            chunk = sock.recv(65536)
            if not chunk:
                break
            got += chunk
        return got


def post(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "host: x", f"content-length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def test_a_claimed_post_takes_the_fast_lane_and_everything_else_uvicorns_path(lane):
    _, port = lane
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        assert client.post("/fast", content=b"x").content == b"fast:x"
        assert client.get("/fast").content == b"asgi:"  # not a POST
        assert client.post("/other", content=b"x").content == b"asgi:x"  # not claimed
        assert client.post("/fast?q=1", content=b"y").content == b"fast:y"  # a query is fine
        reply = client.post("/fast", content=b"z")
        assert reply.headers["date"] and reply.headers["server"] == "uvicorn"  # uvicorn's defaults


def test_what_the_fast_lane_leaves_to_uvicorn_is_still_served(lane):
    _, port = lane
    # Expect: 100-continue is uvicorn's to answer (it sends the 100 when the app reads).
    reply = raw_exchange(port, post("/fast", b"abc", "expect: 100-continue"), b"asgi:abc")
    assert reply.startswith(b"HTTP/1.1 100 Continue") and reply.endswith(b"asgi:abc")
    # A declared body over the limit: the app's own path, which refuses it (here: echoes it).
    big = b"b" * (LIMIT + 1)
    assert raw_exchange(port, post("/fast", big), b"asgi:" + big).endswith(b"asgi:" + big)
    # A percent-encoded path is decoded by uvicorn, not guessed at here.
    assert raw_exchange(port, post("/fa%73t", b"p"), b"asgi:p").endswith(b"asgi:p")


@pytest.mark.parametrize(("first", "second_answered_by"), [
    # The second POST arrives while the first is in flight: uvicorn queues it and serves it.
    ("/slow", b"asgi:2"),
    # `/fast` never waits: it runs to its end inside the parser callback that completed its
    # request (the lane starts it eagerly), so the second is parsed after it, on the lane too.
    ("/fast", b"fast:2"),
], ids=["behind-a-call-in-flight", "behind-a-call-answered-at-once"])
def test_pipelined_requests_are_answered_in_order(lane, first, second_answered_by):
    _, port = lane
    data = post(first, b"1") + post("/fast", b"2") + b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n"
    reply = raw_exchange(port, data, b"asgi:")
    bodies = [part.split(b"\r\n\r\n", 1)[1][:6] for part in reply.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"fast:1", second_answered_by, b"asgi:"], reply


def test_keep_alive_chunked_bodies_and_http_1_0(lane):
    _, port = lane
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for word in (b"hello", b"again"):
            sock.sendall(b"POST /fast HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                         + b"%x\r\n" % len(word) + word + b"\r\n0\r\n\r\n")
            got = b""
            while not got.endswith(b"fast:" + word):
                chunk = sock.recv(65536)
                assert chunk, f"the server closed a keep-alive connection after {got!r}"
                got += chunk
            assert b"connection: close" not in got.lower()
    # HTTP/1.0: answered, then closed by the server (recv returns b"" at the end).
    reply = raw_exchange(port, post("/fast", b"old", version="1.0"), b"\x00never")
    assert reply.endswith(b"fast:old") and b"connection: close" in reply


def test_a_chunked_body_over_the_limit_is_cut_at_the_limit_plus_one(lane):
    _, port = lane
    piece = b"c" * 1000
    data = (b"POST /fast?len HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            + (b"%x\r\n" % len(piece) + piece + b"\r\n") * 5 + b"0\r\n\r\n")
    # 5000 bytes sent; the handler is given LIMIT + 1, enough to know it is over and refuse.
    assert raw_exchange(port, data, b"fast:").endswith(f"fast:{LIMIT + 1}".encode())


def test_a_failing_handler_gets_a_500_and_its_connection_is_closed(lane):
    _, port = lane
    reply = raw_exchange(port, post("/boom", b"x") + post("/fast", b"after"), b"\x00never")
    assert reply.startswith(b"HTTP/1.1 500 ") and b"connection: close" in reply
    assert b"after" not in reply  # nothing more is served on a connection in an unknown state
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:  # the server is fine
        assert client.post("/fast", content=b"ok").content == b"fast:ok"


def test_a_handler_hears_the_client_leave(lane):
    app, port = lane
    app.left.clear()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(post("/wait", b"x"))
    time.sleep(0.1)
    sock.close()
    assert app.left.wait(60), "in 60 s the fast lane's receive() never said http.disconnect"


def test_the_capture_proxy_serves_its_model_calls_in_the_fast_lane():
    from capture import CaptureServer
    from capture.fast_lane import FastLaneProtocol

    with CaptureServer("http://127.0.0.1:9", max_body_bytes=4096) as proxy:
        protocol = proxy._runner._server.config.http_protocol_class
        assert issubclass(protocol, FastLaneProtocol) and protocol.limit == 4096
        for route in ("chat/completions", "responses", "messages"):
            assert protocol.claim(f"/s/abc/v1/{route}") is not None, route
        for path in ("/s/abc/v1/messages/count_tokens", "/s/abc/v1/models", "/admin/sessions",
                     "/s//v1/responses", "/s/abc/v1/chat/completions/"):
            assert protocol.claim(path) is None, path


def test_an_untested_uvicorn_turns_the_lane_off_and_says_so(caplog):
    from capture.fast_lane import fast_lane_protocol

    assert fast_lane_protocol(lambda path: None, 10) is not None  # the installed one
    with caplog.at_level("WARNING", logger="capture.fast_lane"):
        assert fast_lane_protocol(lambda path: None, 10, uvicorn_version="1.2.0") is None
    assert "fast lane is off: uvicorn 1.2.0" in caplog.text


def test_a_streamed_reply_sends_its_head_at_once_and_its_events_chunked(lane):
    app, port = lane
    app.first_token.clear()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(post("/stream", b"x"))
        # The first event is held until the head is here: a lane that held the head for it
        # would leave this recv waiting (socket timeout, 30 s, before the handler's 60 s).
        try:
            head = sock.recv(65536)
        except TimeoutError:
            pytest.fail("in 30 s no head came: the head waited for the first event")
        finally:
            app.first_token.set()
        assert head.endswith(b"\r\n\r\n") and b"transfer-encoding: chunked" in head, head
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
        assert rest == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
