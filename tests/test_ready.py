"""The pre-start check waits, with a deadline, for an engine or service that is still loading.

Run: .venv/bin/python -m pytest tests/test_ready.py -q

The bug this guards: the GPU quick start starts vLLM and the rollout service in the background
and the trainer at once; the trainer's check made one 5 s /health request and stopped while a 4B
model loaded. The fake server here is slow the ways a real one is: not listening at first, then
answering 503 while it loads, then 200. It starts listening only once the waiter has said it is
waiting, so the test needs no sleeps and the order is certain.
"""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from harness.run.ready import Target, wait_ready


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlowServer:
    """/health answers 503 `loading` times, then 200; `start()` begins listening."""

    def __init__(self, port: int, loading: int) -> None:
        self.port, self.left, self.seen = port, loading, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.seen += 1
                status = 503 if server.left > 0 else 200
                server.left -= 1
                body = b"loading weights" if status == 503 else b"{}"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.handler = Handler
        self.httpd: ThreadingHTTPServer | None = None

    def start(self) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()


def test_it_waits_through_not_listening_and_loading_and_says_what_it_waits_on() -> None:
    port = _free_port()
    server = SlowServer(port, loading=3)
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        if server.httpd is None:
            server.start()  # the engine comes up only after the first "waiting" line

    url = f"http://127.0.0.1:{port}"
    try:
        problems = wait_ready([Target("--engine-url", url, "the vLLM engine")], timeout_s=60,
                              poll_s=0.05, report_every_s=0.0, say=say)
    finally:
        server.stop()
    assert problems == []
    assert server.seen == 4  # three 503s while loading, then the 200
    first = lines[0]
    assert "waiting for the vLLM engine at " + url in first and "GET /health" in first
    assert "connection refused" in first and "--ready-timeout-s 60" in first
    assert any("HTTP 503" in line and "loading weights" in line for line in lines)
    assert lines[-1].startswith(f"ready: the vLLM engine at {url}")


def test_past_the_deadline_it_names_the_flag_the_url_and_the_last_failure() -> None:
    port = _free_port()
    server = SlowServer(port, loading=10**9)  # never finishes loading
    server.start()
    url = f"http://127.0.0.1:{port}"
    lines: list[str] = []
    try:
        problems = wait_ready([Target("--rollout-service", url, "the rollout service")],
                              timeout_s=0.5, poll_s=0.05, say=lines.append)
    finally:
        server.stop()
    assert len(problems) == 1
    assert problems[0].startswith(f"--rollout-service {url}: the rollout service did not answer")
    assert "HTTP 503" in problems[0] and "--ready-timeout-s" in problems[0]
    assert lines and "waiting for the rollout service" in lines[0]


def test_ready_targets_cost_one_request_and_say_nothing() -> None:
    port = _free_port()
    server = SlowServer(port, loading=0)
    server.start()
    lines: list[str] = []
    try:
        assert wait_ready([Target("--engine-url", f"http://127.0.0.1:{port}", "the engine")],
                          timeout_s=5, say=lines.append) == []
    finally:
        server.stop()
    assert server.seen == 1 and lines == []


def test_preflight_reports_a_service_that_never_came_up_by_its_flag() -> None:
    from harness.run.preflight import preflight
    from harness.shared.run_config import RunSettings

    port = _free_port()  # nothing listens
    settings = RunSettings(engine_url=f"http://127.0.0.1:{port}", ready_timeout_s=0.5,
                           rollout_service=f"http://127.0.0.1:{port}", output_dir="unused")
    text = "\n".join(preflight(settings, train=True))
    assert f"--engine-url http://127.0.0.1:{port}: the vLLM engine did not answer" in text
    assert f"--rollout-service http://127.0.0.1:{port}: the rollout service did not" in text
    assert "connection refused" in text
