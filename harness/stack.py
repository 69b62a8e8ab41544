"""The processes behind a run: the vLLM engine and the capture proxy, started and stopped in order.

`harness.train` and `harness.eval` both need the same two services, so they live here once:

    with RunStack(settings, run_dir, weight_transfer=True) as stack:
        stack.engine_url, stack.proxy.url, stack.proxy.admin_key, stack.model_path

Start order: the model (built or found), the engine (launched with the weight-transfer backend
this machine needs, or the one at --engine-url), the capture proxy in front of it (its
per-call log under the run dir, so a crash loses nothing captured), and, for remote sandboxes,
the proxy's exposure (a public URL or a tunnel). Stop order is the reverse, on success, error
and Ctrl-C alike (contextlib.ExitStack); the engine's process group dies with us even on SIGKILL
(launchers/reaper.py).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from capture.server import CaptureServer
from harness.run_config import RunSettings, SettingsError
from launchers.engine import Engine, gpu_available
from launchers.models import ModelError, ResolvedModel, resolve_model

__all__ = ["RunStack"]

log = logging.getLogger(__name__)


class RunStack:
    """Engine + capture proxy (+ exposure) for one run. Use as a context manager."""

    def __init__(self, settings: RunSettings, run_dir: Path, *, weight_transfer: bool) -> None:
        self.settings = settings
        self.run_dir = run_dir
        self.weight_transfer = weight_transfer
        self.weight_backend: str | None = None
        self.backend_reason = ""
        self.model: ResolvedModel | None = None
        self.model_path: Path | None = None
        self.engine: Engine | None = None
        self.engine_url = settings.engine_url.rstrip("/") if settings.engine_url else None
        self.proxy: CaptureServer | None = None
        self.exposure = None
        self.timings: dict[str, float] = {}
        self._exit = contextlib.ExitStack()

    def _choose_weight_backend(self) -> None:
        if not self.weight_transfer:
            self.backend_reason = "weight sync off (--no-weight-sync)"
            return
        if gpu_available():
            self.weight_backend, self.backend_reason = "nccl", "a GPU is visible: vLLM's NCCL engine"
        else:
            self.weight_backend = "harness_gloo"
            self.backend_reason = "no GPU: gloo over TCP through the harness_gloo vLLM plugin"

    def __enter__(self) -> RunStack:
        try:
            self._start()
        except BaseException:
            self._exit.close()
            raise
        return self

    def _start(self) -> None:
        s = self.settings
        t0 = time.perf_counter()
        # One local directory for the engine and the trainer: a hub id is downloaded here, once,
        # at one commit (launchers/models.py), so both load the same revision.
        try:
            self.model = resolve_model(s.model)
        except ModelError as exc:  # a settings problem to train/eval: reported, exit code 2
            raise SettingsError([str(exc)]) from exc
        self.model_path = self.model.path
        log.info("model: %s", self.model.describe())
        self.timings["model_s"] = time.perf_counter() - t0
        self._choose_weight_backend()
        log.info("weight sync: %s", self.backend_reason)

        t0 = time.perf_counter()
        if self.engine_url is None:
            self.engine = Engine(self.model_path, port=s.engine_port, served_model_name=s.served_model_name,
                                 weight_transfer_backend=self.weight_backend,
                                 log_path=self.run_dir / "logs" / "vllm.log")
            self._exit.callback(self.engine.stop)
            self.engine.start()
            self.engine_url = self.engine.url
        self.timings["engine_start_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        self.proxy = CaptureServer(self.engine_url, data_dir=self.run_dir / "capture",
                                   host=s.proxy_host, port=s.proxy_port,
                                   public_url=s.proxy_public_url)
        self._exit.callback(self.proxy.stop)
        self.proxy.start()
        if s.sandbox != "local":
            from harness.sandboxes.expose import expose_proxy

            self.exposure = expose_proxy(self.proxy.url, sandbox=s.sandbox,
                                         public_url=s.proxy_public_url, tunnel_command=s.proxy_tunnel)
            self._exit.callback(self.exposure.close)
            # Session base URLs handed to agents must be the public ones (a tunnel's is only
            # known once it is up).
            self.proxy.state.public_url = self.exposure.public_url
        self.timings["proxy_start_s"] = time.perf_counter() - t0

    def __exit__(self, *exc: object) -> None:
        self._exit.close()
