"""Kill a process group when the process that started it dies.

Why: PR_SET_PDEATHSIG only reaches a direct child. vLLM's API server starts engine-core and worker
processes that outlive it: killing a launcher mid-start left an orphaned `VLLM::EngineCore`
holding a core and 2 GB (seen on this machine). So every process group Harness starts gets a
reaper: a tiny process in its own session that polls the launcher's pid and SIGKILLs the group
once the launcher is gone, then exits. It also exits, doing nothing, once the group is empty.

Run as `python -m launchers.reaper <launcher_pid> <pgid>`; `start_reaper()` does that for you.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

__all__ = ["start_reaper"]

POLL_S = 0.5


def _exists(send: Callable[[int, int], None], target: int) -> bool:
    """Whether a process (os.kill) or process group (os.killpg) exists: signal 0 probes it."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, it is just not ours
        return True
    return True


def _alive(pid: int) -> bool:
    return _exists(os.kill, pid)


def _group_alive(pgid: int) -> bool:
    return _exists(os.killpg, pgid)


def start_reaper(pgid: int, launcher_pid: int | None = None) -> subprocess.Popen[bytes]:
    """Start a reaper for `pgid` that fires when `launcher_pid` (default: this process) dies."""
    return subprocess.Popen(
        [sys.executable, "-m", "launchers.reaper", str(launcher_pid or os.getpid()), str(pgid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


def main(launcher_pid: int, pgid: int) -> None:
    while _group_alive(pgid):
        if not _alive(launcher_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
