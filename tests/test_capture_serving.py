"""uvicorn behind capture.guard's GuardedHTTP (capture/serving.py): HTTP/1.1 kept whole.

GuardedHTTP sits in front of uvicorn's own protocol and reads the bytes only to find where a head
ends, so whatever uvicorn serves must be served the same through it: keep-alive, pipelining,
chunked bodies, `Expect: 100-continue`, HTTP/1.0, a client hanging up, a streamed reply's head
sent at once. Real uvicorn on a real socket; raw sockets where the client must do what httpx will
not. (What the guard refuses is tests/test_capture_public.py.)
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

from capture.guard import GuardedHTTP, Limits
from capture.serving import ThreadedUvicorn, read_body


class EchoApp:
    """POST /echo answers `echo:<body>`, /slow does so after 50 ms, /stream streams one event once
    the test says so, /wait waits for the client to leave, /boom raises; anything else `asgi:`."""

    def __init__(self) -> None:
        self.entered = threading.Event()  # /wait has its request
        self.left = threading.Event()
        self.first_token = threading.Event()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/boom":
            raise RuntimeError("a handler bug")
        if path == "/wait":
            await receive()
            self.entered.set()
            assert (await receive())["type"] == "http.disconnect"
            self.left.set()
            return
        if path == "/stream":
            await receive()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await asyncio.get_running_loop().run_in_executor(None, self.first_token.wait, 60)
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        if path == "/slow":
            await asyncio.sleep(0.05)
        body = await read_body(receive)
        content = (b"echo:" if path in ("/echo", "/slow") else b"asgi:") + body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[EchoApp, int, ThreadedUvicorn]]:
    app = EchoApp()
    server = ThreadedUvicorn(app, limits=Limits())
    port = server.start()
    yield app, port, server
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


def test_the_server_runs_the_guard_in_front_of_uvicorns_protocol(served):
    _, port, server = served
    protocol = server._server.config.http_protocol_class
    assert issubclass(protocol, GuardedHTTP) and protocol.limits == Limits()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        reply = client.post("/echo", content=b"x")
        assert reply.content == b"echo:x"
        assert reply.headers["date"] and reply.headers["server"] == "uvicorn"  # uvicorn's own


def test_expect_100_continue_is_uvicorns_to_answer(served):
    _, port, _ = served
    reply = raw_exchange(port, post("/echo", b"abc", "expect: 100-continue"), b"echo:abc")
    assert reply.startswith(b"HTTP/1.1 100 Continue") and reply.endswith(b"echo:abc")


def test_pipelined_requests_are_answered_in_order(served):
    _, port, _ = served
    data = post("/slow", b"1") + post("/echo", b"2") + b"GET /x HTTP/1.1\r\nhost: x\r\n\r\n"
    reply = raw_exchange(port, data, b"asgi:")
    bodies = [part.split(b"\r\n\r\n", 1)[1][:6] for part in reply.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"echo:1", b"echo:2", b"asgi:"], reply


def test_keep_alive_chunked_bodies_and_http_1_0(served):
    _, port, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for word in (b"hello", b"again"):
            sock.sendall(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                         + b"%x\r\n" % len(word) + word + b"\r\n0\r\n\r\n")
            got = b""
            while not got.endswith(b"echo:" + word):
                chunk = sock.recv(65536)
                assert chunk, f"the server closed a keep-alive connection after {got!r}"
                got += chunk
            assert b"connection: close" not in got.lower()
    # HTTP/1.0: answered, then closed by the server (recv returns b"" at the end).
    reply = raw_exchange(port, post("/echo", b"old", version="1.0"), b"\x00never")
    assert reply.endswith(b"echo:old") and b"connection: close" in reply.lower()  # (h11 writes "Connection")


def test_a_head_split_across_reads_is_served(served):
    _, port, _ = served
    data = post("/echo", b"split")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        cut = data.index(b"\r\n\r\n") + 2  # the CRLFCRLF straddles two reads
        sock.sendall(data[:cut])
        # A client pausing mid-head (the scenario, not a wait for a condition): 50 ms lets the
        # first part arrive alone; should the two coalesce, the test still holds, it just does
        # not exercise the split that time.
        time.sleep(0.05)
        sock.sendall(data[cut:])
        got = b""
        while not got.endswith(b"echo:split"):
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk


def test_a_failing_handler_gets_a_500_and_the_server_serves_on(served):
    _, port, _ = served
    reply = raw_exchange(port, post("/boom", b"x"), b"\x00never")
    assert reply.startswith(b"HTTP/1.1 500 ") and b"connection: close" in reply.lower()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        assert client.post("/echo", content=b"ok").content == b"echo:ok"


def test_a_handler_hears_the_client_leave(served):
    app, port, _ = served
    app.entered.clear()
    app.left.clear()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(post("/wait", b"x"))
    assert app.entered.wait(60), "in 60 s the /wait handler never got its request"
    sock.close()  # the handler is waiting: this is the client leaving mid-request
    assert app.left.wait(60), "in 60 s receive() never said http.disconnect"


def test_a_streamed_reply_sends_its_head_at_once_and_its_events_chunked(served):
    app, port, _ = served
    app.first_token.clear()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(post("/stream", b"x"))
        try:
            head = sock.recv(65536)
        except TimeoutError:
            pytest.fail("in 30 s no head came: the head waited for the first event")
        finally:
            app.first_token.set()
        assert head.endswith(b"\r\n\r\n") and b"transfer-encoding: chunked" in head.lower(), head
        rest = b""
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
        assert rest == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
