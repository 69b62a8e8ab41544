# .venv/bin/python -m pytest tests/test_service_guard.py -q
"""`harness.serve` behind the capture proxy's guard (issue 29, finding 9): a head's size bounded by
h11, a body's size checked from its head, a non-ASCII `Authorization` answered 401 (it was a 500),
and its key written only to a 0600 ready file in a 0700 folder, never printed into its log.

A real service process (`spawn_service`) in front of capture's fake engine; raw sockets for what
an HTTP client would refuse to send.
"""

from __future__ import annotations

import os
import socket
import stat

import httpx
import pytest

from capture.fake_engine import FakeEngine
from harness.client.spawn import spawn_service
from harness.serve import write_ready

KEY = "service-guard-test-key"


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with FakeEngine() as engine:
        workdir = tmp_path_factory.mktemp("service")
        with spawn_service(engine.url, workdir, key=KEY, tasks="bundled") as running:
            yield running, workdir


def _raw(url: str, request: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def test_the_key_is_in_a_private_ready_file_and_never_in_the_log(service):
    running, workdir = service
    ready = workdir / "private" / "ready.json"
    assert stat.S_IMODE(ready.stat().st_mode) == 0o600
    assert stat.S_IMODE(ready.parent.stat().st_mode) == 0o700
    assert KEY in ready.read_text()
    log = running.log.read_text()
    assert running.url in log  # the ready line is printed...
    assert KEY not in log  # ...without the key


def test_a_non_ascii_authorization_is_a_401_not_a_500(service):
    running, _ = service
    answer = _raw(running.url, b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                               b"authorization: Bearer \xc3\xa9\xff\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    good = httpx.get(f"{running.url}/metrics", headers={"authorization": f"Bearer {KEY}"})
    assert good.status_code == 200


def test_a_head_past_the_bound_is_refused_and_closed(service):
    running, _ = service
    answer = _raw(running.url, b"GET /health HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * (1 << 20))
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]


def test_a_body_past_the_bound_is_refused_from_its_head(service):
    running, _ = service
    answer = _raw(running.url, b"POST /v1/tasks HTTP/1.1\r\nhost: x\r\n"
                               b"authorization: Bearer " + KEY.encode() + b"\r\n"
                               b"content-length: 999999999\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]


def test_a_ready_file_in_a_folder_others_can_enter_is_refused(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, 0o755)
    with pytest.raises(SystemExit, match="chmod 700"):
        write_ready(folder / "ready.json", {"key": "k"})
    assert not (folder / "ready.json").exists()
