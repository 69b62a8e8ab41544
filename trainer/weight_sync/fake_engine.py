"""A stand-in for vLLM's weight-transfer HTTP routes, with the real gloo wire behind them.

For tests and dry runs of anything that pushes weights, without a vLLM process: it answers the
same routes with the same bodies (see trainer.weight_sync.client), records every request in
order, and receives the tensors for real over the "harness_gloo" wire (it joins the group as
rank 1 and unpacks chunks exactly as the engine-side plugin does), so a test can compare the
received bytes with the trainer's.

Faults are injected per route: `fail["/update_weights"] = (500, body)` answers that route with
that status and body instead of serving it (for /update_weights, before joining the broadcast,
as a vLLM worker that rejects the metadata would). `not_configured=True` answers
/init_weight_transfer_engine with vLLM 0.32's exact error for a server started without
`--weight-transfer-config`; `dev_mode=False` answers 404 on every route, as vLLM does when
VLLM_SERVER_DEV_MODE is unset. `receive=False` records init and update requests without joining
any group (for the NCCL path, whose data plane cannot run without GPUs).

What it does not do: serve completions, or apply weights anywhere but its `weights` dict.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import torch

from trainer.weight_sync.wire import (
    DEFAULT_CHUNK_BYTES,
    GlooGroup,
    TensorMeta,
    chunk_sizes,
    open_gloo_group,
    plan_chunks,
    unpack_chunk,
)

__all__ = ["FakeWeightTransferEngine", "NOT_CONFIGURED_BODY"]

# Captured from vLLM 0.32 (CPU) started without --weight-transfer-config.
NOT_CONFIGURED_BODY = json.dumps(
    {
        "error": {
            "message": "Call to collective_rpc method failed: Worker failed with error 'Weight "
            "transfer not configured. Please set weight_transfer_config to enable weight "
            "transfer.', please check the stack trace above for the root cause",
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
    }
)


class FakeWeightTransferEngine:
    """An HTTP server on 127.0.0.1 speaking vLLM's weight-transfer routes. Context manager."""

    def __init__(
        self, *, dev_mode: bool = True, not_configured: bool = False, receive: bool = True
    ) -> None:
        self.dev_mode = dev_mode
        self.receive = receive
        self.not_configured = not_configured
        self.fail: dict[str, tuple[int, str]] = {}
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, json body + query)
        self.weights: dict[str, torch.Tensor] = {}
        self.weight_version: str | None = None
        self.paused = False
        self._group: GlooGroup | None = None
        self._chunk_bytes = DEFAULT_CHUNK_BYTES
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def start(self) -> FakeWeightTransferEngine:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._group is not None:
            self._group.close()

    def __enter__(self) -> FakeWeightTransferEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- routes -------------------------------------------------------------------------------
    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((path, body))
        if not self.dev_mode:
            return 404, {"detail": "Not Found"}
        if path in self.fail:
            status, text = self.fail[path]
            return status, text
        if path == "/get_world_size":
            return 200, {"world_size": 1}
        if path == "/init_weight_transfer_engine":
            if self.not_configured:
                return 500, NOT_CONFIGURED_BODY
            info = body["init_info"]
            if not self.receive:
                return 200, {"message": "Weight transfer initialized"}
            if self._group is not None:
                self._group.close()
            self._chunk_bytes = info.get("chunk_bytes", DEFAULT_CHUNK_BYTES)
            self._group = open_gloo_group(
                info["master_address"], info["master_port"], 1, info["world_size"], 60.0
            )
            return 200, {"message": "Weight transfer initialized"}
        if path == "/pause":
            self.paused = True
            return 200, {"status": "paused"}
        if path == "/resume":
            self.paused = False
            return 200, {"status": "resumed"}
        if path == "/start_weight_update":
            return 200, {"message": "Weight update started"}
        if path == "/update_weights":
            if self.receive:
                self._receive(body["update_info"])
            return 200, {"message": "Weights updated"}
        if path == "/finish_weight_update":
            self.weight_version = body.get("weight_version", self.weight_version)
            return 200, {"message": "Weight update finished"}
        if path == "/update_weight_version":
            self.weight_version = body["new_version"]
            return 200, {"success": True}
        if path == "/weight_info":
            return 200, {"weight_version": self.weight_version}
        if path == "/is_paused":
            return 200, {"is_paused": self.paused}
        if path == "/shutdown_weight_transfer_engine":
            if self._group is not None:
                self._group.close()
                self._group = None
            return 200, {"message": "Weight transfer shut down"}
        return 404, {"detail": "Not Found"}

    def _receive(self, info: dict[str, Any]) -> None:
        assert self._group is not None, "update_weights before init_weight_transfer_engine"
        metas = [
            TensorMeta(name, dtype, tuple(shape))
            for name, dtype, shape in zip(
                info["names"], info["dtype_names"], info["shapes"], strict=True
            )
        ]
        plan = plan_chunks(metas, self._chunk_bytes)
        for chunk, size in zip(plan, chunk_sizes(metas, plan), strict=True):
            buffer = torch.empty(size, dtype=torch.uint8)
            self._group.broadcast(buffer)
            for name, tensor in unpack_chunk([metas[i] for i in chunk], buffer):
                self.weights[name] = tensor.clone()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _serve(self, method: str) -> None:
                url = urlparse(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body: dict[str, Any] = json.loads(raw) if raw else {}
                body.update({k: v[0] for k, v in parse_qs(url.query).items()})
                try:
                    status, payload = fake.handle(method, url.path, body)
                except Exception as exc:  # a broken transfer: answer as vLLM would, with a 500
                    status, payload = 500, {"error": {"message": f"{type(exc).__name__}: {exc}"}}
                data = payload if isinstance(payload, str) else json.dumps(payload)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data.encode())))
                self.end_headers()
                self.wfile.write(data.encode())

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def log_message(self, *args: Any) -> None:
                pass

        return Handler
