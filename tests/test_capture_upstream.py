"""The engine leg (capture/upstream.py on aiohttp): keep-alive, streaming, the error mapping.

    .venv/bin/python -m pytest tests/test_capture_upstream.py -q

Against small raw asyncio servers where the test needs the engine to misbehave on cue (never
answer, go quiet mid-stream, answer garbage, hang up), and against the fake engine (uvicorn) where
the behaviour is ordinary. Every failure must leave the module as the capture's own error class,
since that class is the cause the harness counts (capture/errors.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable

import orjson
import pytest

from capture.errors import EngineDisconnected, EngineHTTPError, EngineTimeout, EngineUnreachable
from capture.fake_engine import FakeEngine
from capture.upstream import EngineClient
from tests.helpers.waiting import until

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]
CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request's head and body (content-length only, which is all the client sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + (await reader.readexactly(length) if length else b"")


def ok(body: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def chunk(data: bytes) -> bytes:
    """One piece of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def against(handler: Handler, client: Callable[[str, list[int]], Awaitable[None]]) -> None:
    """Run `client(engine_url, connections)` against a raw server running `handler`, which gets
    each connection with its number."""
    connections: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            await handler(reader, writer, connections[-1])
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def run() -> None:
        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        async with server:
            await client(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", connections)

    asyncio.run(run())


def answers(raw: bytes, linger_s: float = 0.0) -> Handler:
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(raw)
        await writer.drain()
        await asyncio.sleep(linger_s)

    return handler


def test_calls_reuse_one_keep_alive_connection():
    seen: list[bytes] = []

    async def handler(reader, writer, n):
        while True:
            seen.append(await read_request(reader))
            writer.write(ok(b'{"data": [{"id": "m"}]}'))
            await writer.drain()

    async def client(url: str, connections: list[int]) -> None:
        engine = EngineClient(url + "/engine/v1")  # a prefix (a reverse proxy's path), and /v1
        assert await engine.served_model() == "m"
        for _ in range(3):
            assert await engine.complete_raw(CHAT) == b'{"data": [{"id": "m"}]}'
        await engine.aclose()
        assert len(connections) == 1
        assert [r.split(b" ")[1] for r in seen] == [b"/engine/v1/models"] + [
            b"/engine/v1/chat/completions"] * 3
        assert all(CHAT in r for r in seen[1:])

    against(handler, client)


def test_a_stream_is_passed_on_as_it_arrives_then_the_connection_is_reused():
    gate = asyncio.Event()

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(STREAM_HEAD + chunk(b'data: {"first": 1}\n\n'))
        await writer.drain()
        await gate.wait()  # the client must have the first event before the rest is sent
        writer.write(chunk(b'data: {"second": 2}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await read_request(reader)  # kept alive: a second request on the same connection
        writer.write(ok(b"again"))
        await writer.drain()

    async def client(url: str, connections: list[int]) -> None:
        engine = EngineClient(url)
        stream = await engine.open_stream(CHAT)
        batches = []
        async for batch in stream.batches():
            batches.append(batch)
            gate.set()
        await stream.aclose()
        assert batches == [[{"first": 1}], [{"second": 2}]]
        # aclose() hands the connection back once the request's writer is done (aiohttp may
        # defer it to a callback): wait for that, not for a fixed while.
        await until(lambda: stream._response.connection is None,
                    "the finished stream's connection to go back to the pool")
        assert await engine.complete_raw(CHAT) == b"again"
        assert len(connections) == 1
        await engine.aclose()

    against(handler, client)


@pytest.mark.parametrize("before_silence", [
    b"",  # never answers at all
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\ndata: {\"a\": 1}\n\n\r\n",
], ids=["no-reply", "quiet-stream"])
def test_an_engine_that_goes_silent_is_an_engine_timeout(before_silence):
    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(before_silence)
        await writer.drain()
        await reader.read()  # silent until the client gives up and hangs up

    async def client(url: str, _: list[int]) -> None:
        engine = EngineClient(url, timeout_s=0.2)
        batches = []
        with pytest.raises(EngineTimeout):
            stream = await engine.open_stream(CHAT)  # no reply: times out here
            async for batch in stream.batches():  # a quiet stream: times out here
                batches.append(batch)
        assert batches == ([[{"a": 1}]] if before_silence else [])
        await engine.aclose()

    against(handler, client)


@pytest.mark.parametrize(("answer", "error"), [
    (b"SMTP ready\r\n\r\n", EngineDisconnected),  # not HTTP at all
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part", EngineDisconnected),
    (b"", EngineDisconnected),  # reads the request, hangs up without a word
    (b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 21\r\n\r\n"
     b'{"error": "it broke"}', EngineHTTPError),
], ids=["garbage", "cut-short", "hang-up", "http-500"])
def test_each_way_a_whole_reply_fails_is_the_capture_error_that_says_so(answer, error):
    async def client(url: str, _: list[int]) -> None:
        engine = EngineClient(url)
        with pytest.raises(error) as caught:
            await engine.complete(CHAT)
        if error is EngineHTTPError:
            assert caught.value.engine_status == 500 and caught.value.status == 502
            assert caught.value.body == {"error": "it broke"}
        await engine.aclose()

    against(answers(answer, linger_s=0.5), client)


def test_a_stream_that_ends_before_done_is_an_engine_disconnect():
    handler = answers(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                      b"10\r\ndata: {\"a\": 1}\n\n\r\n0\r\n\r\n")

    async def client(url: str, _: list[int]) -> None:
        engine = EngineClient(url)
        stream = await engine.open_stream(CHAT)
        with pytest.raises(EngineDisconnected, match="before \\[DONE\\]"):
            async for _batch in stream.batches():
                pass
        await stream.aclose()
        await engine.aclose()

    against(handler, client)


def test_a_refused_connection_is_engine_unreachable():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def run() -> None:
        engine = EngineClient(f"http://127.0.0.1:{port}")
        with pytest.raises(EngineUnreachable):
            await engine.complete(CHAT)
        await engine.aclose()

    asyncio.run(run())


def test_a_stream_left_early_closes_its_connection():
    async def handler(reader, writer, n):
        with contextlib.suppress(ConnectionError):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                         b"10\r\ndata: {\"a\": 1}\n\n\r\n")
            await writer.drain()
            # the left connection never carries another request: it is closed
            assert await reader.read() == b""

    async def client(url: str, connections: list[int]) -> None:
        engine = EngineClient(url, max_connections=1)
        for _ in range(3):  # one connection at most: each needs the last one freed
            stream = await engine.open_stream(CHAT)
            async for _batch in stream.batches():
                break
            await stream.aclose()
        assert len(connections) == 3
        await engine.aclose()

    against(handler, client)


def test_a_real_uvicorn_engine_serves_whole_and_streamed_calls():
    async def run() -> None:
        with FakeEngine() as fake:
            engine = EngineClient(fake.url)
            reply, prompt = await engine.complete(CHAT)
            assert prompt is not None and len(prompt) > 0  # cut out before parsing
            assert reply["choices"][0]["token_ids"]
            body = orjson.dumps({**orjson.loads(CHAT), "stream": True})
            stream = await engine.open_stream(body)
            chunks = [c async for batch in stream.batches() for c in batch]
            await stream.aclose()
            assert stream.prompt is not None and chunks
            await engine.aclose()

    asyncio.run(run())


def test_an_engine_url_the_client_cannot_speak_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="must be http://host"):
        EngineClient("ftp://engine:8000")
    assert EngineClient("http://[::1]:8000/behind/a/proxy/v1/").engine_url == (
        "http://[::1]:8000/behind/a/proxy")


def test_https_verifies_the_engines_certificate(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def run() -> None:
        server = await asyncio.start_server(lambda reader, writer: writer.close(),
                                            "127.0.0.1", 0, ssl=server_tls)
        port = server.sockets[0].getsockname()[1]
        async with server:
            engine = EngineClient(f"https://localhost:{port}")
            with pytest.raises(EngineUnreachable, match="(?i)certificate"):
                await engine.complete(CHAT)  # self-signed: not trusted
            await engine.aclose()

    asyncio.run(run())


def test_time_the_consumer_takes_is_not_the_engines_silence():
    """The read timeout is the engine's silence: a relay slow to ask for the next piece (its
    agent reads slowly) has an engine waiting on it, and must not time out."""

    async def handler(reader, writer, n):
        await read_request(reader)
        writer.write(STREAM_HEAD + chunk(b'data: {"a": 1}\n\n'))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunk(b'data: {"b": 2}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def client(url: str, _: list[int]) -> None:
        engine = EngineClient(url, timeout_s=0.2)
        stream = await engine.open_stream(CHAT)
        batches = []
        async for batch in stream.batches():
            batches.append(batch)
            await asyncio.sleep(0.5)  # two and a half read timeouts, busy elsewhere
        await stream.aclose()
        assert batches == [[{"a": 1}], [{"b": 2}]]
        await engine.aclose()

    against(handler, client)
