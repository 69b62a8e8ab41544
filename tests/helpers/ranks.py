"""Run a script on N CPU ranks under torchrun (gloo) and collect what it wrote.

Shared by the start-up, checkpoint and LoRA-under-FSDP tests. The script runs in a session of
its own, so a hang is killed with all of torchrun's workers, and the caller sees which rank said
what.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_ranks(script: str, out: Path, nproc: int = 2, timeout: float = 400) -> tuple[int, str]:
    """Write `script` to out/run.py and run it on `nproc` ranks; (exit code, stdout + stderr).

    The script gets REPO on sys.path (a header is prepended) and OUT as a string."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "run.py"
    header = (f"import sys\nsys.path.insert(0, {str(REPO)!r})\n"
              f"OUT = {str(out)!r}\n")
    path.write_text(header + script)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if nproc == 1:
        cmd = [sys.executable, str(path)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(nproc), str(path)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        text = f"still running after {timeout} s (hung)"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, text
