"""The engine leg's HTTP client (capture/engine_http.py): keep-alive, resend, bodies, faults.

    .venv/bin/python -m pytest tests/test_capture_engine_http.py -q

Against the real fake engine (uvicorn) where the behaviour is ordinary, and against small raw
asyncio servers where the test needs the server to misbehave on cue: close an idle connection
just as a request arrives, never answer, answer garbage, or stream more than the client buffers.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import Awaitable, Callable

import orjson
import pytest

from capture import engine_http
from capture.engine_http import HIGH_WATER, EngineHTTP
from capture.fake_engine import FakeEngine
from tests.waiting import until

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (content-length only, which is all the client sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n" + extra + b"\r\n" + body)


async def serve(handler: Handler) -> tuple[asyncio.Server, int, list[int]]:
    """A raw server; `handler(reader, writer, n)` gets each connection with its number."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await handler(reader, writer, connections[-1])
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


def against(handler: Handler,
            client: Callable[[int, list[int]], Awaitable[None]]) -> None:
    """Run `client(port, connections)` against a raw server running `handler`."""

    async def run() -> None:
        server, port, connections = await serve(handler)
        async with server:
            await client(port, connections)

    asyncio.run(run())


def test_a_reply_finalised_late_leaves_the_next_request_on_its_connection_alone():
    # The streaming relay stops iterating at `[DONE]` and releases the reply; the suspended
    # iterator is finalised whenever Python collects it, by then under the next request.
    async def run() -> None:
        with FakeEngine() as fake:
            pool = EngineHTTP.for_url(fake.url)
            first = await pool.request("GET", "/v1/models")
            pieces = first.iter_any()
            assert b'"data"' in await anext(pieces)
            first.release()  # finished: its connection goes back to the pool
            fake.token_delay_s = 0.02  # the next reply streams for a while
            body = orjson.dumps({"model": "m", "stream": True,
                                 "messages": [{"role": "user", "content": "hi"}]})
            second = await pool.request("POST", "/v1/chat/completions", body)
            await pieces.aclose()  # the first reply's late release, mid-way through the second
            assert (await second.read()).rstrip().endswith(b"data: [DONE]")
            assert pool.opened == 1  # one connection, reused, and not closed under the second
            assert orjson.loads(await (await pool.request("GET", "/v1/models")).read())["data"]
            assert pool.opened == 1

    asyncio.run(run())


def test_requests_reuse_one_keep_alive_connection_to_a_real_uvicorn_engine():
    async def run() -> None:
        with FakeEngine() as fake:
            pool = EngineHTTP.for_url(fake.url)
            for _ in range(5):
                reply = await pool.request("GET", "/v1/models")
                assert reply.status == 200
                assert orjson.loads(await reply.read())["data"][0]["id"]
            body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
            reply = await pool.request("POST", "/v1/chat/completions", body)
            assert reply.status == 200 and "prompt_token_ids" in orjson.loads(await reply.read())
            assert pool.opened == 1
            await pool.aclose()

    asyncio.run(run())


def test_an_idle_connection_older_than_the_engines_keep_alive_is_not_reused(monkeypatch):
    monkeypatch.setattr(engine_http, "IDLE_S", 0.05)

    async def run() -> None:
        with FakeEngine() as fake:
            pool = EngineHTTP.for_url(fake.url)
            await (await pool.request("GET", "/v1/models")).read()
            await asyncio.sleep(0.1)
            await (await pool.request("GET", "/v1/models")).read()
            assert pool.opened == 2

    asyncio.run(run())


def test_a_request_on_a_connection_the_engine_closed_unread_is_sent_once_more():
    """The keep-alive race: the engine closes an idle connection as the next request is sent."""
    answered: list[bytes] = []

    async def handler(reader, writer, n):
        while True:
            request = await read_request(reader)
            if answered and n == 0:  # the second request on the first connection: drop it
                return
            answered.append(request)
            writer.write(ok(b'{"n": %d}' % len(answered)))
            await writer.drain()

    async def client(port: int, connections: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        assert await (await pool.request("POST", "/x", b"{}")).read() == b'{"n": 1}'
        assert await (await pool.request("POST", "/x", b"{}")).read() == b'{"n": 2}'
        assert (pool.opened, len(connections), len(answered)) == (2, 2, 2)
        await pool.aclose()

    against(handler, client)


def test_a_new_connection_dropped_before_the_reply_is_an_error_not_a_resend():
    async def handler(reader, writer, n):
        await read_request(reader)  # read it, then hang up without a word

    async def client(port: int, connections: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        with pytest.raises(ConnectionError):
            await pool.request("POST", "/x", b"{}")
        assert len(connections) == 1

    against(handler, client)


def answers(raw: bytes, linger_s: float = 0.0) -> Handler:
    """A server that answers each connection's first request with `raw` bytes, then stays
    `linger_s` before closing it."""

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        await asyncio.sleep(linger_s)

    return handler


def test_a_reply_delimited_by_closing_the_connection_is_read_whole_and_not_reused():
    handler = answers(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        for _ in range(2):
            assert await (await pool.request("GET", "/x")).read() == b"until the end"
        assert pool.opened == 2

    against(handler, client)


def test_a_chunked_stream_is_passed_on_as_it_arrives():
    gate = asyncio.Event()

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await gate.wait()  # the client must have the first chunk before the second is sent
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await read_request(reader)  # kept alive: a second request on the same connection
        writer.write(ok(b"again"))
        await writer.drain()

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        reply = await pool.request("POST", "/x", b"{}")
        pieces = []
        async for piece in reply.iter_any():
            pieces.append(piece)
            gate.set()
        assert pieces == [b"first", b"second"]
        assert await (await pool.request("POST", "/x", b"{}")).read() == b"again"
        assert pool.opened == 1

    against(handler, client)


def big_reply(size: int) -> Handler:
    """A server that answers `size` bytes as fast as the socket takes them."""

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(b"x" * 65536)
            await writer.drain()

    return handler


def test_a_slow_consumer_pauses_the_socket_instead_of_buffering_the_stream():
    size = 16 * HIGH_WATER

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        reply = await pool.request("GET", "/x")
        largest = total = 0
        async for piece in reply.iter_any():
            largest = max(largest, len(piece))
            total += len(piece)
            await asyncio.sleep(0.002)  # slower than loopback
        assert total == size
        # what piled up between two reads stayed near the high-water mark
        assert largest <= HIGH_WATER + 1024 * 1024

    against(big_reply(size), client)


def test_a_whole_reply_wakes_its_caller_once_it_is_all_in_and_is_never_paused():
    """`whole=True`: the request returns when the reply is complete (its head written apart from
    its body, as uvicorn does), so `read` has nothing to wait for; one larger than the high-water
    mark is not paused, which would deadlock a caller that waits for the end."""
    size = 4 * HIGH_WATER

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)
        writer.write(b"whole")
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        started = asyncio.get_running_loop().time()
        reply = await pool.request("POST", "/x", b"{}", whole=True)
        assert asyncio.get_running_loop().time() - started >= 0.2  # not at the head
        assert reply._connection.complete and await reply.read() == b"whole"
        reply = await asyncio.wait_for(pool.request("POST", "/x", b"{}", whole=True), 60)
        assert not reply._connection._paused
        assert len(await reply.read()) == size
        assert pool.opened == 1

    against(handler, client)


def test_a_whole_reply_cut_short_fails_the_request_itself():
    handler = answers(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        with pytest.raises(ConnectionResetError, match="mid-reply"):
            await pool.request("POST", "/x", b"{}", whole=True)

    against(handler, client)


def test_time_the_consumer_keeps_the_socket_paused_is_not_the_engine_being_silent():
    # The read timeout is the engine's silence. A reply paused at the high-water mark because the
    # agent reads slowly has an engine that is waiting on us: it must not time out.
    size = 4 * HIGH_WATER

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port, read_timeout_s=0.2)
        reply = await pool.request("GET", "/x")
        pieces = reply.iter_any()
        total = len(await anext(pieces))
        await until(lambda: reply._connection._paused,
                    "the reply to fill the buffer and the socket to be paused")
        await asyncio.sleep(0.6)  # three read timeouts, paused
        async for piece in pieces:
            total += len(piece)
        assert total == size

    against(big_reply(size), client)


@pytest.mark.parametrize("before_silence", [
    b"",  # never answers at all
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n",  # a stream goes quiet
], ids=["no-reply", "quiet-stream"])
def test_an_engine_that_goes_silent_times_out(before_silence):
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(before_silence)
        await writer.drain()
        await reader.read()  # silent until the client gives up and hangs up

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port, read_timeout_s=0.2)
        pieces = []
        with pytest.raises(TimeoutError):
            reply = await pool.request("GET", "/x")  # no reply: times out here
            async for piece in reply.iter_any():  # a quiet stream: times out here
                pieces.append(piece)
        assert pieces == ([b"hi"] if before_silence else [])

    against(handler, client)


def test_garbage_instead_of_http_is_a_connection_error():
    handler = answers(b"SMTP ready\r\n\r\n", linger_s=1)

    async def client(port: int, _: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port)
        with pytest.raises(ConnectionResetError, match="invalid HTTP"):
            await pool.request("GET", "/x")

    against(handler, client)


def test_a_refused_connection_raises_at_once():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def run() -> None:
        pool = EngineHTTP("127.0.0.1", port)
        with pytest.raises(ConnectionRefusedError):
            await pool.request("GET", "/x")

    asyncio.run(run())


def test_a_stream_left_early_closes_its_connection_and_frees_its_slot():
    async def handler(reader, writer, n):
        with contextlib.suppress(ConnectionError):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nhi\r\n")
            await writer.drain()
            await read_request(reader)  # the left connection never carries another request
            raise AssertionError("a connection with an unfinished reply was reused")

    async def client(port: int, connections: list[int]) -> None:
        pool = EngineHTTP("127.0.0.1", port, max_connections=1)
        for _ in range(3):  # one slot: each request needs the last one's slot back
            reply = await pool.request("GET", "/x")
            async for _piece in reply.iter_any():
                break
            reply.release()
        assert len(connections) == 3

    against(handler, client)


def test_an_engine_url_the_client_cannot_speak_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="must be http://host"):
        EngineHTTP.for_url("ftp://engine:8000")
    v6 = EngineHTTP.for_url("http://[::1]:8000/behind/a/proxy/")
    assert (v6.host, v6.port, v6.prefix, v6.tls) == ("::1", 8000, "/behind/a/proxy", None)
    secure = EngineHTTP.for_url("https://engine.example")
    assert secure.port == 443 and secure.tls is not None
    assert secure.tls.verify_mode == ssl.CERT_REQUIRED


def test_https_with_a_verified_certificate_and_a_path_prefix(tmp_path):
    """TLS through the same protocol: a self-signed engine the client's context trusts."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    client_tls = ssl.create_default_context(cafile=str(cert))
    paths: list[bytes] = []

    async def handler(reader, writer, n):
        request = await read_request(reader)
        paths.append(request.split(b" ")[1])
        writer.write(ok(b'{"secure": true}'))
        await writer.drain()
        await reader.read()

    async def run() -> None:
        server = await asyncio.start_server(
            lambda r, w: handler(r, w, 0), "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]
        async with server:
            pool = EngineHTTP("localhost", port, tls=client_tls, prefix="/engine")
            reply = await pool.request("GET", "/v1/models")
            assert await reply.read() == b'{"secure": true}'
            await pool.aclose()
            untrusting = EngineHTTP("localhost", port, tls=ssl.create_default_context())
            with pytest.raises(ssl.SSLCertVerificationError):
                await untrusting.request("GET", "/v1/models")
        assert paths == [b"/engine/v1/models"]

    asyncio.run(run())
