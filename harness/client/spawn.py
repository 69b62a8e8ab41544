"""A rollout service as a child process: `python -m harness.serve` started, waited for, stopped.

For tests, benchmarks and `harness.train` on one host (harness.run.stack). It runs in the process
that starts the service, the trainer's included, so it imports nothing of the service side: the
child is started by module name and read back through its ready file.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["KEY_ENV", "LocalService", "spawn_service"]

KEY_ENV = "HARNESS_SERVICE_KEY"  # where a service reads its key (the rollout client, service_pool, too)


@dataclass
class LocalService:
    """A `python -m harness.serve` child in its own process group."""

    url: str
    key: str
    process: Any  # subprocess.Popen
    log: Path
    reaper: Any = None  # launchers.reaper: kills the group if the process that spawned it dies

    def kill(self) -> None:
        """SIGKILL the service and everything it started (its process group)."""
        import signal

        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._end_reaper()

    def _end_reaper(self) -> None:
        if self.reaper is not None:
            self.reaper.kill()
            self.reaper.wait()
            self.reaper = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (it closes its sessions and proxy), SIGKILL past `timeout_s`."""
        import signal
        import subprocess

        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._end_reaper()

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_service(engine_url: str, workdir: Path, *, key: str | None = None,
                  tasks: str = "bundled", task_count: int | None = None, max_sessions: int = 8,
                  timeout_s: float = 120.0, own_cache: bool = True,
                  data_dir: Path | None = None, python: str | Path | None = None,
                  extra_args: list[str] | None = None) -> LocalService:
    """Start a rollout service with its temp dir (and, by default, its own cache and data)
    under `workdir`; wait until it serves (its ready file), or raise with its log's tail.

    `own_cache=False` shares this process's $HARNESS_CACHE (`harness.train`'s local service:
    its sandboxes' cached environments are the ones a run always used); `data_dir` is where the
    capture proxy's per-call log goes (<data_dir>/capture); `python` the interpreter with
    harbor and openenv (default: this one); `extra_args` more `harness.serve` flags."""
    import subprocess

    from launchers.paths import REPO_ROOT

    workdir = Path(workdir)
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    private = workdir / "private"  # the ready file holds the key: a folder only we can enter
    private.mkdir(mode=0o700, exist_ok=True)
    private.chmod(0o700)
    ready, log_path = private / "ready.json", workdir / "service.log"
    ready.unlink(missing_ok=True)
    key = key or secrets.token_urlsafe(32)
    env = {**os.environ, KEY_ENV: key, "TMPDIR": str(workdir / "tmp"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    if own_cache:
        env["HARNESS_CACHE"] = str(workdir / "cache")
    command = [str(python or sys.executable), "-m", "harness.serve", "--engine-url", engine_url,
               "--tasks", tasks, "--port", "0", "--max-sessions", str(max_sessions),
               "--data-dir", str(data_dir or workdir / "data"), "--ready-file", str(ready)]
    if task_count is not None:
        command += ["--task-count", str(task_count)]
    command += list(extra_args or [])
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    from launchers.reaper import start_reaper

    service = LocalService("", key, process, log_path, start_reaper(process.pid))
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            service.kill()
            why = (f"exited {process.returncode}" if process.returncode is not None
                   else f"did not serve within {timeout_s:.0f} s")
            raise RuntimeError(f"the rollout service {why}; its log ({log_path}) ends:\n"
                               + log_path.read_text()[-3000:])
        time.sleep(0.1)
    service.url = json.loads(ready.read_text())["url"]
    return service
