"""A local bubblewrap sandbox: start, exec, put/get files, stop. No Harbor types here.

`BwrapSandbox` is the engine under `BwrapEnvironment` (the Harbor adapter in `bwrap.py`); the
agents and session code may use either. Lifecycle:

    start():  make a private host dir (run/, net/), listen on run/ctl.sock, open the port
              relays, spawn `bwrap ... python3 supervisor` on a capped tmpfs root, wait for
              "ready" (the command line and the wait: local_launch.py), then copy the seed
              files in
    exec():   one control connection per command (channel.run_command)
    put/get:  tar streamed through exec, so every path is resolved inside the sandbox's own view
              (an agent's symlink cannot aim a host-side write at a host file): local_files.py
    prepare_grading():  between the agent and the verifier: the supervisor kills every process
              of the sandbox's pid namespace but itself, puts back the merged-/usr symlinks
              and the grader hook files (GRADING_HOOKS) and makes the grading dirs fresh;
              returns a `GradingReset` (what was killed and what the agent left there). The
              verifier then runs with GRADING_ENV (bwrap.py says what that covers and not).
              The requests to pid 1 and the wait that notices it dying: local_pid1_ops.py
    stop():   SIGKILL the sandbox's pid-1 (the kernel then kills every process in its pid
              namespace), reap bwrap, close the relays, remove the cgroup and the private dir

Measured here (bench/sandbox_startup.py, 2 shared cores at load average 9-13): stop 5-10 ms,
first exec 6-13 ms, start 100-180 ms wall of which ~40-55 ms is CPU: start is the supervisor's
Python start-up waiting for a core. Moving the private dirs to /dev/shm took stop from ~55 ms
to ~7 ms; cutting the supervisor's imports (see supervisor.py) took its import time 10x down.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.service.sandboxes.channel import OutputSink, PortForwarder, RawExecResult, run_command
from harness.service.sandboxes.errors import (
    SandboxClosedError,
    SandboxDiedError,
    SandboxExecError,
    SandboxExecTimeoutError,
    SandboxStartError,
)
from harness.service.sandboxes.grading_state import (
    GRADER_PYTHON_DIR,
    GRADING_ENV,
    GRADING_HOME,
    GRADING_HOOKS,
    GRADING_PATHS,
    GRADING_SCRATCH,
    MIN_FREE_BYTES,
    MIN_FREE_INODES,
    TOOLCHAIN_HOOKS,
    GradingReset,
    grading_env,
)
from harness.service.sandboxes.limits import ProcessCgroup, SandboxLimits
from harness.service.sandboxes.local_files import FilesThroughExec
from harness.service.sandboxes.local_launch import (
    READY_TIMEOUT_S,
    check_bwrap_available,
    read_ready,
    supervisor_argv,
)
from harness.service.sandboxes.local_pid1_ops import Pid1Requests
from harness.service.sandboxes.mounts import BASE_PATH
from harness.service.sandboxes.supervisor_build import (
    compiled_supervisor,
    default_base_dir,
)

__all__ = [
    "BASE_ENV",
    "GRADING_ENV",
    "GRADING_HOME",
    "GRADING_HOOKS",
    "GRADING_PATHS",
    "GRADING_SCRATCH",
    "GRADER_PYTHON_DIR",
    "MIN_FREE_BYTES",
    "MIN_FREE_INODES",
    "TOOLCHAIN_HOOKS",
    "BwrapSandbox",
    "GradingReset",
    "SandboxSpec",
    "compiled_supervisor",
    "default_base_dir",
    "grading_env",
]

logger = logging.getLogger(__name__)

_LIVE: set[BwrapSandbox] = set()  # started, not yet stopped (strong refs: stop them at exit)

# The only variables a command sees besides the spec's and the caller's: no host secrets pass.
BASE_ENV = {
    "PATH": BASE_PATH,
    "HOME": "/root",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
    "TMPDIR": "/tmp",
    "USER": "root",
    "SHELL": "/bin/sh",
    "IS_SANDBOX": "1",
}


@dataclass
class SandboxSpec:
    """What a sandbox looks like from inside.

    ro_binds: {host path: sandbox path}, read-only (agent CLIs, venvs; see mounts.resolved_tool_binds)
    forward:  {sandbox loopback port: (host, port)}: 127.0.0.1:PORT inside reaches host:port
    env:      variables every command gets (on top of BASE_ENV, under the caller's own)
    seed:     {sandbox path: host file or dir} copied in at start, before start() returns
    """

    workdir: str = "/app"
    ro_binds: Mapping[str, str] = field(default_factory=dict)
    forward: Mapping[int, tuple[str, int]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    seed: Mapping[str, Path] = field(default_factory=dict)
    hostname: str = "sandbox"


class BwrapSandbox(FilesThroughExec, Pid1Requests):
    """One running sandbox. Not reusable: start() once, stop() once (stop is idempotent)."""

    def __init__(self, spec: SandboxSpec, *, name: str = "sandbox", base_dir: Path | None = None):
        self.spec = spec
        self.name = name
        self._base_dir = base_dir
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._ctl: socket.socket | None = None
        self._child_pid: int | None = None
        self._cgroup: ProcessCgroup | None = None
        self._forward_key: str | None = None
        self._stopped = False
        self.timings: dict[str, float] = {}

    # -- paths ----------------------------------------------------------------------------------
    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        check_bwrap_available()
        if self.dir is not None:
            raise SandboxStartError(f"sandbox {self.name} was already started")
        t0 = time.perf_counter()
        base = self._base_dir or default_base_dir()
        self.dir = Path(tempfile.mkdtemp(prefix=f"harness-sbx-{self.name[:40]}-", dir=base))
        try:
            await self._start()
            for target, source in self.spec.seed.items():
                source = Path(source)
                if source.is_dir():
                    await self.put_dir(source, target)
                else:
                    await self.put_file(source.read_bytes(), target)
        except BaseException:
            await self.stop()
            raise
        self.timings["start_s"] = time.perf_counter() - t0

    async def _start(self) -> None:
        assert self.dir is not None
        for sub in ("run", "net"):
            (self.dir / sub).mkdir()

        ctl_path = self.dir / "run" / "ctl.sock"
        self._ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ctl.bind(str(ctl_path))
        self._ctl.listen(64)
        self._ctl.set_inheritable(True)

        net_dir: Path | None = None
        forward_map: dict[str, str] = {}
        if self.spec.forward:
            net_dir = self.dir / "net"
            self._forward_key = f"{self.name}-{uuid.uuid4().hex}"
            PortForwarder.shared().open(self._forward_key, net_dir, dict(self.spec.forward))
            forward_map = {str(p): f"/run/harness/{p}.sock" for p in self.spec.forward}

        info_r, info_w = os.pipe()
        spec = self.spec
        argv = supervisor_argv(workdir=spec.workdir, ro_binds=spec.ro_binds, limits=spec.limits,
                               hostname=spec.hostname, ctl_fd=self._ctl.fileno(),
                               forward=forward_map, net_dir=net_dir, info_fd=info_w)
        self._cgroup = ProcessCgroup.create(self.name, self.spec.limits)
        if self._cgroup is not None:
            argv = self._cgroup.wrap(argv)
        # Plain Popen, not asyncio's subprocess: the session may start the sandbox in one event
        # loop and stop it in another (or from sync code), and an asyncio transport dies with
        # the loop that made it.
        with open(self.dir / "run" / "supervisor.log", "wb") as log:
            try:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    pass_fds=(self._ctl.fileno(), info_w),
                    env={"PATH": BASE_PATH},
                    start_new_session=True,
                )
            finally:
                os.close(info_w)
        _LIVE.add(self)
        try:
            ready = await asyncio.to_thread(read_ready, self._proc, READY_TIMEOUT_S)
            # bwrap wrote {"child-pid": N} before the supervisor could print "ready"; read
            # without blocking, since the write end may stay open in bwrap.
            os.set_blocking(info_r, False)
            info = os.read(info_r, 4096) if ready else b""
        finally:
            os.close(info_r)
        if not ready:
            raise SandboxStartError(
                f"sandbox {self.name} did not start (bwrap exit {self._proc.poll()}); "
                f"log tail: {self._log_tail()!r}"
            )
        self._child_pid = int(json.loads(info.split(b"}")[0] + b"}")["child-pid"])

    @property
    def log_path(self) -> Path | None:
        """The supervisor's stderr on the host (gone after stop(): it lives in the private dir)."""
        return None if self.dir is None else self.dir / "run" / "supervisor.log"

    def _log_tail(self) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")[-2000:]

    def _check_alive(self) -> None:
        """Raise SandboxDiedError when pid 1 is gone and we did not stop it; Closed when stopped."""
        if self._proc is not None and not self._stopped and self._proc.poll() is not None:
            tail = self._log_tail()
            raise SandboxDiedError(
                f"sandbox {self.name}: its pid 1 exited (bwrap status {self._proc.returncode}) "
                f"while nothing on the host had stopped it; log tail: {tail[-500:]!r}",
                status=self._proc.returncode,
                log_tail=tail,
            )
        if not self.running or self.dir is None:
            raise SandboxClosedError(f"sandbox {self.name} is not running")

    async def stop(self) -> None:
        """Kill every process of the sandbox, close its relays and remove its files. Idempotent.

        Safe from any event loop (and under cancellation: the kill happens first, synchronously,
        and the cleanup runs in `finally`).
        """
        if self._stopped:
            return
        self._stopped = True
        t0 = time.perf_counter()
        self._kill_all()
        try:
            if self._proc is not None:
                deadline = time.monotonic() + 5.0
                while self._proc.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.001)
        finally:
            self._cleanup()
        self.timings["stop_s"] = time.perf_counter() - t0

    def stop_sync(self) -> None:
        """`stop()` for sync code and interpreter exit."""
        if self._stopped:
            return
        self._stopped = True
        self._kill_all()
        try:
            if self._proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(5.0)
        finally:
            self._cleanup()

    def _kill_all(self) -> None:
        if self._child_pid is not None:
            # The sandbox's pid 1 (the supervisor): when it dies the kernel kills its whole pid
            # namespace, and bwrap (its parent) reaps it and exits, so once bwrap is gone, all
            # of the sandbox's processes are.
            _kill(self._child_pid)
        elif self._proc is not None:
            _kill(self._proc.pid)  # never got ready: bwrap's child dies with it (die-with-parent)

    def _cleanup(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            _kill(self._proc.pid)  # bwrap itself is wedged; its child dies with it
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(5.0)
        if self._proc is not None and self._proc.stdout is not None:
            self._proc.stdout.close()
        _LIVE.discard(self)
        if self._ctl is not None:
            self._ctl.close()
        if self._forward_key is not None:
            PortForwarder.shared().close(self._forward_key)
        if self._cgroup is not None:
            self._cgroup.remove()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def enforced_limits(self) -> dict[str, str]:
        """What actually caps this sandbox (for logs): rlimits always, cgroups where writable."""
        out = {k: f"rlimit {v}" for k, v in self.spec.limits.rlimits().items()}
        if self._cgroup is not None:
            out["processes"] = f"pids cgroup {self.spec.limits.max_processes}"
            if self._cgroup.memory:
                out["memory"] = f"memory cgroup {self.spec.limits.memory_mb} MiB"
        return out

    @property
    def supervisor_pid(self) -> int | None:
        """The host pid of the sandbox's pid 1 (None before start): for logs and fault tests."""
        return self._child_pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self._stopped

    # -- commands -------------------------------------------------------------------------------
    async def exec(
        self,
        argv: list[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdin: bytes = b"",
        on_output: OutputSink | None = None,
    ) -> RawExecResult:
        """Run argv inside; raises SandboxExecTimeoutError past the deadline (group killed),
        SandboxDiedError when the sandbox's pid 1 died under it."""
        self._check_alive()
        assert self.dir is not None
        timeout = timeout_s if timeout_s is not None else self.spec.limits.default_exec_timeout_s
        full_env = {**BASE_ENV, **self.spec.env, **(env or {})}
        run = run_command(
            self.dir / "run" / "ctl.sock",
            argv,
            env=full_env,
            cwd=cwd or self.spec.workdir,
            timeout_s=timeout,
            stdin=stdin,
            on_output=on_output,
        )
        # The supervisor enforces the deadline; this backstop covers a wedged supervisor.
        try:
            result = await self._unless_pid1_dies(
                asyncio.wait_for(run, timeout + 30) if timeout else run
            )
        except SandboxExecError:
            await self._settle()
            self._check_alive()
            raise
        if result.timed_out:
            raise SandboxExecTimeoutError(
                f"command timed out after {timeout} seconds and was killed: {argv[-1][:200]!r}",
                timeout_s=float(timeout or 0),
                stdout=result.stdout.decode(errors="replace"),
                stderr=result.stderr.decode(errors="replace"),
            )
        return result

    async def shell(self, command: str, **kwargs) -> RawExecResult:
        return await self.exec(["/bin/sh", "-c", command], **kwargs)

@atexit.register
def _stop_leftovers() -> None:
    """Sandboxes still running at interpreter exit: kill them and remove their dirs."""
    for box in list(_LIVE):
        box.stop_sync()


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
