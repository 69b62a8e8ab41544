# .venv/bin/python -m pytest tests/test_capture_bounds.py -q
"""Bounded memory in the proxy (capture.guard; issue 29, finding 7): a head pipelined behind a call
in flight, bodies held by one session's calls in flight, and one session's concurrent requests
are each bounded, and one session's use never takes another's share.

A slow fake engine keeps calls in flight (each reply takes a known time); raw sockets where the
point is bytes a client would never send. No fixed sleeps: every wait polls a condition.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from capture.fake_engine import FakeEngine
from capture.guard import Limits

HI = [{"role": "user", "content": "hi"}]


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture(scope="module")
def slow():
    with FakeEngine(token_delay_s=0.1) as engine:  # a whole reply takes ~2.5 s
        yield engine


def _head(url: str, info, length: int) -> bytes:
    return (f"POST /s/{info.session_id}/v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            f"authorization: Bearer {info.secret}\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n\r\n").encode()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=60)


def test_a_head_pipelined_behind_a_call_in_flight_is_bounded_then_refused(slow):
    with CaptureServer(slow.url) as proxy, CaptureClient(proxy.url, proxy.admin_key) as client:
        info = client.create_session()
        body = json.dumps({"model": "m", "messages": HI}).encode()
        before = rss_bytes()
        with _connect(proxy.url) as sock:
            sock.sendall(_head(proxy.url, info, len(body)) + body)
            # then a head that never ends, as fast as the proxy takes it, for 2 s
            sock.setblocking(False)
            pad = b"POST /x HTTP/1.1\r\nx-pad: " + b"a" * (1 << 20)
            sent, deadline = 0, time.monotonic() + 2.0
            while time.monotonic() < deadline:
                try:
                    sent += sock.send(pad if sent == 0 else pad[26:])
                except BlockingIOError:
                    time.sleep(0.01)  # the kernel's buffers are full: the proxy stopped reading
            grown = rss_bytes() - before
            sock.setblocking(True)
            sock.settimeout(60)
            answer, closed = b"", False
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
                closed = True
            except ConnectionResetError:  # closed with our unread bytes still in its buffers
                closed = True
        # the proxy took a socket read or so; the kernel's buffers hold the rest (a few MiB)
        assert sent < 32 << 20, sent
        assert grown < 24 << 20, (grown, sent)
        assert closed  # the endless head was refused and its connection closed
        assert answer == b"" or answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        assert client.stats(info.session_id)["n_ok"] == 1  # the call in flight was served


def _post(url: str, info, body: bytes, results: list, index: int) -> None:
    reply = httpx.post(f"{url}/s/{info.session_id}/v1/chat/completions", content=body,
                       headers={"authorization": f"Bearer {info.secret}",
                                "content-type": "application/json"}, timeout=60)
    results[index] = reply.status_code


def _wait_in_flight(client, session_id: str, n: int) -> None:
    deadline = time.monotonic() + 60
    while client.stats(session_id)["in_flight"] < n:
        assert time.monotonic() < deadline, "calls never reached the engine"
        time.sleep(0.02)


def test_one_sessions_requests_in_flight_are_capped_and_another_session_is_not_affected(slow):
    limits = Limits(max_session_requests=2)
    with CaptureServer(slow.url, limits=limits) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        a, b = client.create_session(), client.create_session()
        body = json.dumps({"model": "m", "messages": HI}).encode()
        results: list = [None] * 4
        threads = [threading.Thread(target=_post, args=(proxy.url, a, body, results, i))
                   for i in range(2)]
        for thread in threads:
            thread.start()
        _wait_in_flight(client, a.session_id, 2)
        _post(proxy.url, a, body, results, 2)  # a third of a's, while two are in flight
        other = threading.Thread(target=_post, args=(proxy.url, b, body, results, 3))
        other.start()
        for thread in [*threads, other]:
            thread.join(60)
    assert results == [200, 200, 429, 200]


def test_bodies_held_by_one_sessions_calls_in_flight_are_capped_per_session(slow):
    limits = Limits(max_body_bytes=1 << 20, max_session_body_bytes=(3 << 20) // 2)
    with CaptureServer(slow.url, limits=limits) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        a, b = client.create_session(), client.create_session()
        big = json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "x" * ((1 << 20) - 200)}]}).encode()
        assert len(big) < 1 << 20
        results: list = [None] * 3
        first = threading.Thread(target=_post, args=(proxy.url, a, big, results, 0))
        first.start()
        _wait_in_flight(client, a.session_id, 1)  # its ~1 MiB body is held while it runs
        _post(proxy.url, a, big, results, 1)  # a's second: 2 MiB in flight > 1.5 MiB
        other = threading.Thread(target=_post, args=(proxy.url, b, big, results, 2))
        other.start()
        for thread in (first, other):
            thread.join(60)
    assert results == [200, 413, 200]
