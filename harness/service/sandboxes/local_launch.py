"""How the host starts a local sandbox's pid 1: the bwrap command line, and the wait for "ready".

The host side of supervisor.py's start (local.py's `BwrapSandbox.start` runs it and owns what it
starts): the supervisor's config (control socket, port relays, rlimits, device nodes), the
read-only binds (the compiled supervisor, the grader's Python dir), and the line the supervisor
prints once it serves. Its own module so that local.py reads as the sandbox's life (start, exec,
grading, stop) in one sitting.
"""

from __future__ import annotations

import marshal
import os
import select
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from harness.service.sandboxes.errors import SandboxPathError, SandboxUnavailableError
from harness.service.sandboxes.grading_state import GRADER_PYTHON_DIR
from harness.service.sandboxes.limits import SandboxLimits
from harness.service.sandboxes.mounts import DEV_NODES, bwrap_argv
from harness.service.sandboxes.supervisor_build import (
    SANDBOX_PYTHON,
    compiled_supervisor,
    grader_python_dir,
)

__all__ = ["READY_TIMEOUT_S", "SUPERVISOR_DIR_IN_SANDBOX", "check_bwrap_available", "read_ready",
           "supervisor_argv"]

SUPERVISOR_DIR_IN_SANDBOX = "/run/harness-supervisor"
_SUPERVISOR_STUB = (
    f"import sys; sys.path.insert(0, {SUPERVISOR_DIR_IN_SANDBOX!r}); "
    "import supervisor; supervisor.main()"
)
READY_TIMEOUT_S = 20.0


def check_bwrap_available() -> None:
    """Raise SandboxUnavailableError naming the fix when the local sandbox cannot run here."""
    if shutil.which("bwrap") is None:
        raise SandboxUnavailableError(
            "bubblewrap (bwrap) is not installed: run `apt-get install -y bubblewrap` "
            "(./setup.sh does it), or pick a remote sandbox with --sandbox docker|e2b|daytona|modal"
        )
    if not os.access(SANDBOX_PYTHON, os.X_OK):
        raise SandboxUnavailableError(
            f"{SANDBOX_PYTHON} is missing: the local sandbox's supervisor runs on the host's "
            "system Python (apt-get install -y python3-minimal)"
        )


def supervisor_argv(*, workdir: str, ro_binds: Mapping[str, str], limits: SandboxLimits,
                    hostname: str, ctl_fd: int, forward: dict[str, str], net_dir: Path | None,
                    info_fd: int) -> list[str]:
    """The command that starts the sandbox with the supervisor as its pid 1 (bwrap --as-pid-1).

    `forward`: {sandbox port: the relay's unix socket path inside}; `info_fd`: where bwrap
    writes {"child-pid": N}; the control socket `ctl_fd` is inherited by pid 1."""
    config = {
        "ctl_fd": ctl_fd,
        "forward": forward,
        "limits": limits.rlimits(),
        "dev_nodes": list(DEV_NODES),
    }
    payload = marshal.dumps(config, 4).hex()  # the supervisor reads marshal, not JSON
    compiled = compiled_supervisor()
    binds = {
        **ro_binds,
        str(compiled): SUPERVISOR_DIR_IN_SANDBOX,
        str(grader_python_dir()): GRADER_PYTHON_DIR,
    }
    command = [SANDBOX_PYTHON, "-I", "-S", "-c", _SUPERVISOR_STUB, payload]
    inside = PurePosixPath(workdir)
    if not inside.is_absolute() or ".." in inside.parts:
        raise SandboxPathError(f"workdir must be absolute without '..': {inside}")
    return bwrap_argv(
        root_size_bytes=limits.root_size_bytes(),
        shm_size_bytes=limits.shm_size_bytes(),
        dirs=[
            "/tmp",
            "/root",
            "/logs/agent",
            "/logs/verifier",
            "/logs/artifacts",
            str(inside),
        ],
        net_dir=net_dir,
        ro_binds=binds,
        hostname=hostname,
        info_fd=info_fd,
        command=command,
    )


def read_ready(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait (in a worker thread) for the supervisor's "ready" line; False on exit or timeout."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return False
        chunk = os.read(fd, 64)
        if not chunk:
            return False
        buf += chunk
    return buf.split(b"\n", 1)[0].strip() == b"ready"
