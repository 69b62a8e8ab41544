"""The viewer's HTTP server: one static page, its vendored assets, and the run's JSON on request.

The stdlib's ThreadingHTTPServer is enough: one person, a handful of requests per click, and it
starts in milliseconds with nothing to install. Every JSON answer is computed when asked from the
files of the run directory (harness/view/data.py re-reads only what was appended), so the page
of a running run is live: reload, or let the page poll. It binds 127.0.0.1 unless told otherwise.

    GET /                          the page (static/index.html: plain JS, uPlot for the plots)
    GET /static/<file>             app.js, style.css, uPlot (vendored from npm, MIT)
    GET /api/run?run=a|b           settings, plots' series, counts, the run's own before/after
                                   (before_after.json) and its sides' rollout counts
    GET /api/rollouts?run=a|b      the index: one light row per rollout of every side (train or
                                   eval, eval-before, eval-after), each row with its `side`
    GET /api/rollout/<n>?run=a|b&side=S
                                   one rollout of side S (default: the run's own): record,
                                   group, turns with decoded tokens
    GET /api/compare               both runs' pass rate per task (404 without --compare)
"""

from __future__ import annotations

import json
import logging
import math
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from harness.view.data import RunData

__all__ = ["ViewServer"]

log = logging.getLogger("harness.view")
STATIC = Path(__file__).parent / "static"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".txt": "text/plain; charset=utf-8"}


def _clean(value: Any) -> Any:
    """JSON has no NaN/Infinity (the browser's JSON.parse rejects them): they become None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


class ViewServer:
    """Serves one run (and optionally a second to compare) until `close()`.

        with ViewServer(RunData(run_dir), port=0) as server:
            print(server.url)
    """

    def __init__(self, run: RunData, compare: RunData | None = None, *,
                 host: str = "127.0.0.1", port: int = 0):
        self.runs = {"a": run, "b": compare} if compare is not None else {"a": run}
        handler = type("Handler", (_Handler,), {"view": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        self.url = f"http://{self.host}:{self.port}/"
        self._thread: threading.Thread | None = None

    def start(self) -> ViewServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="harness-view",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
        self.httpd.server_close()

    def __enter__(self) -> ViewServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- routes ----------------------------------------------------------------------------------
    def answer(self, path: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        which = (query.get("run") or ["a"])[0]
        run = self.runs.get(which)
        if run is None:
            return 404, {"error": f"no run {which!r}: this viewer serves "
                                  f"{sorted(self.runs)} (start it with --compare for 'b')"}
        if path == "/api/run":
            return 200, {**run.run(), "compare": "b" in self.runs}
        if path == "/api/rollouts":
            return 200, {"rollouts": run.all_rollouts()}
        if path.startswith("/api/rollout/"):
            tail = path.rsplit("/", 1)[1]
            if not tail.isdigit():
                return 400, {"error": f"rollout index must be a number, got {tail!r}"}
            try:
                side = run.side((query.get("side") or [""])[0])
                return 200, {**side.rollout(int(tail)), "side": side.dir.name
                             if side is not run else run.kind()}
            except (KeyError, FileNotFoundError) as exc:
                return 404, {"error": str(exc).strip("'\"")}
        if path == "/api/compare":
            if "b" not in self.runs:
                return 404, {"error": "start the viewer with --compare RUN_B to compare two runs"}
            return 200, {k: {"dir": str(r.dir.resolve()), "run": r.run()["pass_rate_by_task"],
                             "rollouts": r.rollouts()} for k, r in self.runs.items()}
        return 404, {"error": f"no route {path}"}


class _Handler(BaseHTTPRequestHandler):
    view: ViewServer
    server_version = "harness-view"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib's name)
        log.debug("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # a live run changes under the page
        self.end_headers()
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):  # the page moved on before the answer
            log.debug("client left before %s was answered", self.path)

    def do_GET(self) -> None:  # noqa: N802 (stdlib's name)
        url = urlparse(self.path)
        path = unquote(url.path)
        if path in ("/", "/index.html"):
            path = "/static/index.html"
        if path.startswith("/static/"):
            name = path[len("/static/"):]
            file = STATIC / name
            if "/" in name or name.startswith(".") or not file.is_file():
                self._send(404, b"not found", CONTENT_TYPES[".txt"])
                return
            self._send(200, file.read_bytes(), CONTENT_TYPES.get(file.suffix, "text/plain"))
            return
        if path.startswith("/api/"):
            try:
                status, payload = self.view.answer(path, parse_qs(url.query))
            except Exception as exc:  # show the page what broke instead of a dropped connection
                log.exception("viewer request %s failed", self.path)
                status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
            try:
                body = json.dumps(payload, default=str, allow_nan=False).encode()
            except ValueError:  # a NaN somewhere in a record: cleaned only when there is one
                body = json.dumps(_clean(payload), default=str, allow_nan=False).encode()
            self._send(status, body, "application/json")
            return
        self._send(HTTPStatus.NOT_FOUND, b"not found", CONTENT_TYPES[".txt"])
