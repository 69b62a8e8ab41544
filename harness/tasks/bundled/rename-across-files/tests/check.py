"""The grader: the agent's main.py runs in a child process; the checks and the reward are ours.

Run as `python3 -I /tests/check.py` (nothing imported from the work dir). Whatever the agent's
code started is ended before the reward is written, so nothing of it can write the reward after
us.
"""

import os
import re
import subprocess
import time
from pathlib import Path


def _stat(pid: int) -> tuple[str, int, int]:
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return rest[0], int(rest[1]), int(rest[19])  # state, ppid, start time


def end_leftovers() -> None:
    """SIGKILL every process started since this grader began, but its own ancestors."""
    me = os.getpid()
    start = _stat(me)[2]
    ancestors, pid = set(), me
    while pid > 1:
        ancestors.add(pid)
        try:
            pid = _stat(pid)[1]
        except (OSError, IndexError, ValueError):
            break
    for _ in range(200):
        left = 0
        for name in os.listdir("/proc"):
            if not name.isdigit() or int(name) in ancestors:
                continue
            try:
                state, _, started = _stat(int(name))
            except (OSError, IndexError, ValueError):
                continue
            if state != "Z" and started >= start:
                try:
                    os.kill(int(name), 9)
                    left += 1
                except ProcessLookupError:
                    pass
        if not left:
            return
        time.sleep(0.02)


def main() -> None:
    try:
        done = subprocess.run(["python3", "main.py"], capture_output=True, text=True, timeout=30,
                              cwd="/app")
        out = (done.stdout + done.stderr).strip()
    except subprocess.TimeoutExpired:
        out = "(timed out)"
    sources = [p for p in Path("/app").rglob("*.py") if p.is_file() and not p.is_symlink()]
    leftover = [str(p) for p in sources if "get_usr" in p.read_text(errors="replace")]
    users = Path("/app/app/users.py")
    defined = users.is_file() and re.search(r"^def get_user\b", users.read_text(), re.M)
    ok = out == "report: alice, bob" and not leftover and bool(defined)
    print(f"main.py printed: {out!r}; get_usr left in: {leftover}; get_user defined: "
          f"{bool(defined)}")
    end_leftovers()
    with open("/logs/verifier/reward.txt", "w") as f:
        f.write(f"{int(ok)}\n")


if __name__ == "__main__":
    main()
