"""Process groups Harness starts die with their launcher, grandchildren included.

Run: .venv/bin/python -m pytest tests/test_foundation_reaper.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from launchers.paths import REPO_ROOT
from tests.helpers.waiting import wait_until

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


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) pids in process group `pgid`, from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def test_killing_the_launcher_kills_its_process_group_including_grandchildren() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], cwd=REPO_ROOT,
                                stdout=subprocess.PIPE, text=True)
    pgid = int(launcher.stdout.readline())
    # The grandchild must exist before the launcher dies, or its death would prove nothing.
    wait_until(lambda: len(group_members(pgid)) >= 2, "the child to start its grandchild",
               state=lambda: group_members(pgid))
    os.kill(launcher.pid, signal.SIGKILL)  # no cleanup code of the launcher runs
    launcher.wait()
    try:
        wait_until(lambda: not group_alive(pgid), "the group to die with its launcher",
                   timeout_s=60, state=lambda: group_members(pgid))
    finally:
        if group_alive(pgid):
            os.killpg(pgid, signal.SIGKILL)
