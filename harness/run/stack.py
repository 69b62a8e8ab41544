"""The processes behind a run: the vLLM engine, then the rollout side, started and stopped in order.

`harness.train` and `harness.eval` both need a model and an engine, so they live here once:

    with RunStack(settings, run_dir, weight_transfer=True, rollouts="service") as stack:
        stack.engine_url, stack.service_urls, stack.service_key     # harness.train
    with RunStack(settings, run_dir, weight_transfer=False) as stack:
        stack.engine_url                                            # harness.eval

- rollouts="service" (harness.train): rollout services (`python -m harness.serve`). Without
  --rollout-service, one is started here as a child process
  (harness.client.spawn.spawn_service) from the project venv, pointed at the engine: it owns
  the tasks, sandboxes, agents, the capture proxy (its per-call log under <run>/capture) and,
  for remote sandboxes, the proxy's exposure (the --proxy-* settings travel to it). It starts
  while the engine loads, so it adds no wall time. With --rollout-service the services are
  someone else's and nothing is started for them.
- rollouts=None (harness.eval): the engine only. harness.eval runs rollouts in its own process,
  so it starts its capture proxy itself (harness.service.local_proxy) inside this stack.

This module runs in the trainer's process and imports neither harbor, openenv nor capture, not
even lazily (tests/test_import_graph.py): vLLM's NCCL engine on GPUs shares that process.

Start order: the model (built or found), the engine (launched with the weight-transfer backend
this machine needs, or the one at --engine-url) and the rollout side. Stop order is the reverse,
on success, error and Ctrl-C alike (contextlib.ExitStack); the engine's and the local service's
process groups die with us even on SIGKILL (launchers/reaper.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.shared.run_config import RunSettings, SettingsError
from launchers.engine import Engine, gpu_available
from launchers.models import ModelError, ResolvedModel, resolve_model

__all__ = ["ROLLOUT_LAYOUTS", "RunStack", "service_key", "service_python"]

log = logging.getLogger(__name__)
ROLLOUT_LAYOUTS = ("service", None)  # rollout services, or none (the caller runs rollouts)
SERVICE_PYTHON_ENV = "HARNESS_SERVICE_PYTHON"


def service_key(settings: RunSettings) -> str | None:
    """The running services' key: --rollout-service-key-file, else $HARNESS_SERVICE_KEY."""
    from harness.client.remote import KEY_ENV

    if settings.rollout_service_key_file:
        return Path(settings.rollout_service_key_file).read_text().strip() or None
    return os.environ.get(KEY_ENV) or None


def service_python() -> str:
    """The interpreter a local rollout service runs with: one that has harbor and openenv.

    On CPU the trainer runs from the project venv, which has them: this same interpreter. On
    GPUs the trainer runs from .trainer-venv (vLLM, no openenv), so the service runs from the
    project venv (.venv), or $HARNESS_SERVICE_PYTHON.
    """
    override = os.environ.get(SERVICE_PYTHON_ENV)
    if override:
        return override
    import importlib.util

    if importlib.util.find_spec("harbor") is not None:  # found, not imported
        return sys.executable
    from launchers.paths import project_python

    return str(project_python())


class RunStack:
    """Model, engine and rollout services (or none). Use as a context manager."""

    def __init__(self, settings: RunSettings, run_dir: Path, *, weight_transfer: bool,
                 rollouts: str | None = None) -> None:
        if rollouts not in ROLLOUT_LAYOUTS:
            raise ValueError(f"rollouts={rollouts!r}: choose one of {ROLLOUT_LAYOUTS}")
        self.settings = settings
        self.run_dir = run_dir
        self.weight_transfer = weight_transfer
        self.rollouts = rollouts
        self.weight_backend: str | None = None
        self.backend_reason = ""
        self.model: ResolvedModel | None = None
        self.model_path: Path | None = None
        self.engine: Engine | None = None
        self.engine_url = settings.engine_url.rstrip("/") if settings.engine_url else None
        self.service: Any = None  # harness.client.spawn.LocalService, when started here
        self.service_urls: list[str] = []
        self.service_key: str | None = None
        self.timings: dict[str, float] = {}
        self._exit = contextlib.ExitStack()

    def _choose_weight_backend(self) -> None:
        if not self.weight_transfer:
            self.backend_reason = "weight sync off (--no-weight-sync)"
            return
        if self.settings.lora_rank > 0:
            self.weight_backend = "lora"
            self.backend_reason = (f"LoRA rank {self.settings.lora_rank}: adapters through "
                                   "vLLM's /v1/load_lora_adapter, one name per version")
        elif gpu_available():
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

    def resolve_model(self) -> ResolvedModel:
        """The one local directory the engine and the trainer load: a hub id is downloaded here,
        once, at one commit (launchers/models.py), so both load the same revision; no --model
        is the committed warm start for this run's agent."""
        s = self.settings
        spec = s.model
        if spec is not None and (Path(spec).expanduser() / "adapter_config.json").is_file():
            spec = str(self._merged(Path(spec).expanduser()))
        try:
            self.model = resolve_model(spec, harness=s.harness, tasks=s.tasks)
        except ModelError as exc:  # a settings problem to train/eval: reported, exit code 2
            raise SettingsError([str(exc)]) from exc
        self.model_path = self.model.path
        return self.model

    def _merged(self, adapter: Path) -> Path:
        """--model a LoRA adapter folder (a LoRA run's <output-dir>/trainer/model): merged into
        its base (adapter_config.json's base_model_name_or_path) as an HF model in the run
        folder, which the engine then serves like any model: exact, and no LoRA flags needed."""
        from launchers.adapters import merge_adapter_dir

        t0 = time.perf_counter()
        merged = merge_adapter_dir(adapter, self.run_dir / "merged-model")
        log.info("--model %s is a LoRA adapter: merged into its base at %s (%.1f s)", adapter,
                 merged, time.perf_counter() - t0)
        return merged

    def _start(self) -> None:
        s = self.settings
        t0 = time.perf_counter()
        log.info("model: %s", self.resolve_model().describe())
        self.timings["model_s"] = time.perf_counter() - t0
        self._choose_weight_backend()
        log.info("weight sync: %s", self.backend_reason)

        t0 = time.perf_counter()
        engine_url = self.engine_url
        if engine_url is None:
            self.engine = Engine(self.model_path, port=s.engine_port, served_model_name=s.served_model_name,
                                 # LoRA pushes need no weight-transfer engine in vLLM
                                 weight_transfer_backend=(None if self.weight_backend == "lora"
                                                          else self.weight_backend),
                                 lora_rank=s.lora_rank,
                                 log_path=self.run_dir / "logs" / "vllm.log",
                                 tensor_parallel_size=s.engine_tensor_parallel_size,
                                 data_parallel_size=s.engine_data_parallel_size)
            engine_url = self.engine.url  # its port is chosen before it starts
        # The local service needs only the engine's URL to start: it starts while vLLM loads.
        pending = self._spawn_service(engine_url) if self.rollouts == "service" else None
        if self.engine is not None:
            self._exit.callback(self.engine.stop)
            self.engine.start()
        self.engine_url = engine_url
        self.timings["engine_start_s"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        if self.rollouts == "service":
            self._services(pending)
            self.timings["service_wait_s"] = time.perf_counter() - t0

    def _spawn_service(self, engine_url: str) -> Future | None:
        """Start the local rollout service in a thread (None with --rollout-service)."""
        if self.settings.rollout_service_urls():
            return None
        from harness.client.spawn import spawn_service

        s = self.settings
        extra = ["--sandbox", s.sandbox, "--proxy-host", s.proxy_host,
                 "--proxy-port", str(s.proxy_port)]
        if s.proxy_public_url:
            extra += ["--proxy-public-url", s.proxy_public_url]
        if s.proxy_tunnel:
            extra += ["--proxy-tunnel", s.proxy_tunnel]
        executor = ThreadPoolExecutor(1, thread_name_prefix="rollout-service")
        pending = executor.submit(
            spawn_service, engine_url, self.run_dir / "service", tasks=s.tasks,
            task_count=s.task_count, max_sessions=s.max_concurrent_rollouts, own_cache=False,
            data_dir=self.run_dir, python=service_python(), extra_args=extra)

        def stop_it() -> None:
            # Registered first, so it runs last: after the engine stopped. The spawn may still
            # be under way (an error or Ctrl-C during the engine's start): wait for it, stop it.
            executor.shutdown(wait=True)
            with contextlib.suppress(Exception):
                pending.result().stop()

        self._exit.callback(stop_it)
        return pending

    def _services(self, pending: Future | None) -> None:
        if pending is None:
            self.service_urls = self.settings.rollout_service_urls()
            self.service_key = service_key(self.settings)
            return
        self.service = pending.result()
        # Stopped before the engine (ExitStack: last registered, first closed); stopping twice
        # is a no-op, so the spawn's own callback stays harmless.
        self._exit.callback(self.service.stop)
        self.service_urls, self.service_key = [self.service.url], self.service.key

    def __exit__(self, *exc: object) -> None:
        self._exit.close()
