"""Local sandbox start + teardown time (target: under 100 ms), measured, not asserted.

    .venv/bin/python bench/sandbox_startup.py [--n 20] [--forward] [--harbor]

Three figures per configuration, each the median (and p90) over --n sandboxes started and stopped
one after another:
    start      BwrapSandbox.start(): private dir, control socket, bwrap, supervisor "ready"
    first exec one `true` through the control channel (what the first agent command pays extra)
    stop       BwrapSandbox.stop(): kill pid 1, reap, remove relays, cgroup and private dir
    cpu s+s    CPU time (ours + bwrap + supervisor) of start + stop: load-independent

`--harbor` measures BwrapEnvironment.start/stop on a bundled task instead (adds the Dockerfile
recipe and Harbor's constructor). The supervisor runs on the host's /usr/bin/python3, whose
start-up dominates `start`; it is slower when the machine is loaded (other helpers' pip
installs or a vLLM engine share the 2 cores here), so the load average is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.service.sandboxes import BwrapSandbox, SandboxSpec, process_cap_mode  # noqa: E402


def _summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p90 = ms[min(len(ms) - 1, int(round(0.9 * (len(ms) - 1))))]
    return f"median {statistics.median(ms):6.1f} ms  p90 {p90:6.1f} ms"


async def _bench_sandbox(n: int, forward: bool) -> dict[str, list[float]]:
    spec = SandboxSpec(forward={54321: ("127.0.0.1", 54321)} if forward else {})
    out: dict[str, list[float]] = {
        "start": [],
        "first exec": [],
        "stop": [],
        "start+stop": [],
        "cpu s+s": [],
    }
    for i in range(n):
        box = BwrapSandbox(spec, name=f"bench{i}")
        c0 = _cpu()
        t0 = time.perf_counter()
        await box.start()
        t1 = time.perf_counter()
        c1 = _cpu()
        await box.shell("true")
        t2 = time.perf_counter()
        c2 = _cpu()
        await box.stop()
        t3 = time.perf_counter()
        c3 = _cpu()
        out["start"].append(t1 - t0)
        out["first exec"].append(t2 - t1)
        out["stop"].append(t3 - t2)
        out["start+stop"].append((t1 - t0) + (t3 - t2))
        out["cpu s+s"].append((c1 - c0) + (c3 - c2))
    return out


def _cpu() -> float:
    """CPU seconds used so far by this process and its reaped children (bwrap, supervisor).

    Unlike wall time this barely moves with the machine's load, so it is the figure to compare
    against the 100 ms target when the 2 cores here are shared: start+stop is one chain of
    processes, so on an idle machine its wall time is close to its CPU time.
    """
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


async def _bench_harbor(n: int) -> dict[str, list[float]]:
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from harness.service.sandboxes.bwrap import BwrapEnvironment
    from harness.tasks import BUNDLED_DIR

    task = Task(BUNDLED_DIR / "fix-python-function")
    out: dict[str, list[float]] = {"start": [], "stop": [], "start+stop": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(n):
            paths = TrialPaths(Path(tmp) / str(i))
            paths.mkdir()
            env = BwrapEnvironment(
                environment_dir=task.paths.environment_dir,
                environment_name=task.short_name,
                session_id=f"bench-{i}",
                trial_paths=paths,
                task_env_config=task.config.environment.model_copy(),
                logger=logging.getLogger("bench"),
            )
            t0 = time.perf_counter()
            await env.start(force_build=False)
            t1 = time.perf_counter()
            await env.stop(delete=True)
            t2 = time.perf_counter()
            out["start"].append(t1 - t0)
            out["stop"].append(t2 - t1)
            out["start+stop"].append(t2 - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--forward", action="store_true", help="with one forwarded port")
    parser.add_argument("--harbor", action="store_true", help="BwrapEnvironment on a task")
    args = parser.parse_args()
    mode, reason = process_cap_mode()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; process cap: {mode}")
    print(f"  ({reason})")
    asyncio.run(_bench_sandbox(2, args.forward))  # warm the page cache and imports
    if args.harbor:
        results = asyncio.run(_bench_harbor(args.n))
        label = "BwrapEnvironment (fix-python-function)"
    else:
        results = asyncio.run(_bench_sandbox(args.n, args.forward))
        label = "BwrapSandbox" + (" + 1 forwarded port" if args.forward else "")
    print(f"{label}, n={args.n}")
    for key, values in results.items():
        print(f"  {key:<11} {_summary(values)}")
    for key in ("start+stop", "cpu s+s"):
        if key in results:
            verdict = "under" if statistics.median(results[key]) < 0.1 else "OVER"
            print(f"target {key} < 100 ms: {verdict}")


if __name__ == "__main__":
    main()
