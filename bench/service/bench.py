"""Rollouts as a service, measured: throughput with one and two services, the service's added
latency per rollout, and the concurrency one service sustains before that overhead passes 5%.

    PYTHONPATH=. .venv/bin/python bench/service/bench.py [--n 8] [--concurrency 1 2 4 8]

The engine is harness/audit/scripted_engine.py (instant replies, vLLM's wire shape, the tiny model's
tokenizer): the model solves hello-file in two calls (the solving command, then mini-swe-agent's
submit), so every rollout is the same real one: bubblewrap sandbox, capture proxy, the
mini-swe-agent CLI, Harbor's verifier, the TrainingTrace, teardown. Each service is a
`python -m harness.serve` process with its own cache, data and temp dirs.

Per rollout (seconds):
    service   = the service's own RolloutResult.timings["total"] (what it spent on the rollout)
    client    = the client's wall time from `rollout()` call to result (RemoteSessionFactory)
    overhead  = client - service: admission, HTTP, the long poll's wake-up, the trace's JSON
    share     = overhead / client
Rollouts/minute = n / the batch's wall time, one service vs two, same n and concurrency.

The machine is shared (2 cores), so the load average is printed beside the figures; the agent
CLIs (Python start-up, litellm import) set the pace, not the service. Figures and their reading:
bench/service/README.md (7 ms added per rollout alone, 105 ms at 16 sessions, share < 0.3%).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from harness.audit.scripted_engine import ScriptedEngine, shell_task
from harness.client.remote import RemoteSessionFactory
from harness.tasks import BUNDLED_DIR
from launchers.tiny_model import build_tiny_model
from tests.helpers.service import start_service

SOLVE = "printf 'Hello, Harness!\\n' > /app/greeting.txt"
SCRIPT = shell_task(SOLVE, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", final="Done.")
KEY = "bench-service-key"


async def batch(client: RemoteSessionFactory, n: int) -> tuple[float, list]:
    t0 = time.monotonic()
    results = await asyncio.gather(*(client.rollout(seed=0) for _ in range(n)))
    return time.monotonic() - t0, results


def report(label: str, wall: float, results: list, concurrency: int) -> dict:
    ok = [r for r in results if r.cause == "ok"]
    over = [r.timings["service_overhead"] for r in ok]
    share = [r.timings["service_overhead"] / r.timings["client_total"] for r in ok]
    row = {
        "label": label, "c": concurrency, "n": len(results), "ok": len(ok),
        "per_min": 60 * len(results) / wall,
        "service_s": statistics.median(r.timings["total"] for r in ok) if ok else float("nan"),
        "overhead_ms": 1000 * statistics.median(over) if over else float("nan"),
        "overhead_max_ms": 1000 * max(over) if over else float("nan"),
        "share": statistics.median(share) if share else float("nan"),
    }
    print(f"{label:<14} c={concurrency:<3} n={row['n']:<3} ok={row['ok']:<3} "
          f"{row['per_min']:6.1f} rollouts/min  service {row['service_s']:6.2f} s  "
          f"overhead median {row['overhead_ms']:6.0f} ms (max {row['overhead_max_ms']:5.0f})  "
          f"share {100 * row['share']:5.2f}%  load {os.getloadavg()[0]:.1f}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8, help="rollouts per batch")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-service-"))
    opts = dict(harness="mini-swe-agent", sampling={"temperature": 1.0}, max_tokens=256,
                max_steps=4, agent_timeout_s=300, max_attempts=1)
    with ScriptedEngine(build_tiny_model(), SCRIPT) as engine:
        top = max(args.concurrency)
        a = start_service(engine.url, work / "a", tasks=str(BUNDLED_DIR / "hello-file"),
                          key=KEY, max_sessions=top)
        b = start_service(engine.url, work / "b", tasks=str(BUNDLED_DIR / "hello-file"),
                          key=KEY, max_sessions=top)
        rows = []
        try:
            warm = RemoteSessionFactory([a.url, b.url], KEY, max_concurrent_rollouts=2, **opts)
            asyncio.run(batch(warm, 2))  # each service loads its factory once
            for c in args.concurrency:
                for label, urls in (("one service", [a.url]), ("two services", [a.url, b.url])):
                    client = RemoteSessionFactory(urls, KEY, max_concurrent_rollouts=c, **opts)
                    wall, results = asyncio.run(batch(client, args.n))
                    rows.append(report(label, wall, results, c))
                    client.close()
        finally:
            a.stop()
            b.stop()
    over = [r for r in rows if r["label"] == "one service" and r["share"] > 0.05]
    print("one service: overhead share passes 5% at concurrency",
          over[0]["c"] if over else f"> {max(args.concurrency)} (not reached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
