"""Process groups Harness starts die with their launcher, grandchildren included.

Run: .venv/bin/python -m pytest tests/test_foundation_reaper.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from launchers.paths import REPO_ROOT

# A launcher that starts a process group (child + grandchild, like vLLM's API server and engine
# core), arms a reaper for it, prints the group id, then waits to be killed.
LAUNCHER = """
import subprocess, sys, time
from launchers.reaper import start_reaper
group = subprocess.Popen([sys.executable, "-c",
    "import subprocess, time; subprocess.Popen(['sleep', '300']); time.sleep(300)"],
    start_new_session=True)
start_reaper(group.pid)
print(group.pid, flush=True)
time.sleep(300)
"""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killing_the_launcher_kills_its_process_group_including_grandchildren() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, text=True)
    pgid = int(launcher.stdout.readline())
    time.sleep(0.5)  # let the grandchild start
    assert group_alive(pgid)
    os.kill(launcher.pid, signal.SIGKILL)  # no cleanup code of the launcher runs
    launcher.wait()
    deadline = time.monotonic() + 10
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = group_alive(pgid)
    if alive:
        os.killpg(pgid, signal.SIGKILL)
    assert not alive, "the group outlived its launcher"
