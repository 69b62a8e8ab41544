"""The grader: each case calls the agent's median() in a child process; the verdict is ours.

Run as `python3 -I /tests/test_stats.py` (nothing imported from the work dir). The agent's code
runs only in the children, so it can neither patch these checks nor end this process with a
success of its own; whatever it started is ended before the reward is written, so nothing of
it can write the reward after us.
"""

import json
import os
import subprocess
import sys
import time

CHILD = (
    "import json, sys\n"
    "sys.path.insert(0, '/app')\n"
    "from stats import median\n"
    "values = json.loads(sys.argv[1])\n"
    "result = median(values)\n"
    "print('\\nRESULT ' + json.dumps([result, values]))\n"
)
CASES = [  # (input, expected median): odd, even (mean of the middle two), single, not mutated
    ([3, 1, 2], 2),
    ([4, 1, 3, 2], 2.5),
    ([7], 7),
    ([10, 2, 38, 23, 38, 23, 21], 23),
    ([5, 1], 3),
]


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


def case_passes(values: list, expected: float) -> bool:
    try:
        done = subprocess.run([sys.executable, "-I", "-c", CHILD, json.dumps(values)],
                              capture_output=True, text=True, timeout=20, cwd="/")
    except subprocess.TimeoutExpired:
        return False
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or len(lines) != 1:
        print(f"median({values}): exit {done.returncode}, {done.stderr[-300:]}")
        return False
    result, after = json.loads(lines[0][len("RESULT "):])
    ok = isinstance(result, (int, float)) and result == expected and after == values
    print(f"median({values}) = {result!r} (expected {expected}, input after {after}): "
          f"{'ok' if ok else 'wrong'}")
    return ok


def main() -> None:
    passed = all([case_passes(values, expected) for values, expected in CASES])
    end_leftovers()
    with open("/logs/verifier/reward.txt", "w") as f:
        f.write(f"{int(passed)}\n")


if __name__ == "__main__":
    main()
