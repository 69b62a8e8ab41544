"""Harness overhead per rollout and rollouts per minute at concurrency 1, 4, 8 (measured).

    .venv/bin/python bench/rollouts/bench.py [--agents mini-swe-agent opencode] [--n 8]
                                             [--concurrency 1 4 8] [--token-delay-ms 0]

The engine is `capture.fake_engine` (instant deterministic replies, vLLM's wire shape), so what is
left is the harness and the agent CLI itself. Each rollout is a real one: bubblewrap sandbox,
in-process capture proxy, the real agent CLI on the bundled hello-file task, Harbor's verifier,
the TrainingTrace fetched, everything torn down. The fake's replies carry no tool call, so
opencode ends after one step and mini-swe-agent after its step limit (--max-steps).

Per rollout, from `RolloutResult.timings` (seconds):
    harness  = sandbox_start + agent_start + verify + fetch_trace + teardown   (ours)
    agent    = agent_run: the CLI from exec to exit (its own start-up, its model calls)
    ratio    = harness / total    (target: < 20% at concurrency 8)
Rollouts/minute = n / wall time of the batch. Target for sandbox start + teardown: < 100 ms.

The machine is shared (2 cores here), so the load average is printed next to the figures.

Measured 2026-11-29 (2 cores, load average 9-19 from other test runs; --n 8, --max-steps 3):
    agent           c   rollouts/min   median total   median harness   harness / total
    mini-swe-agent  1        1.7           34.1 s          464 ms           1.6%
    mini-swe-agent  4        5.1           45.9 s          826 ms           1.9%
    mini-swe-agent  8        6.5           73.6 s         1507 ms           2.0%
    opencode        1        1.6           37.5 s          752 ms           2.2%
    opencode        4        3.3           72.7 s         1048 ms           1.4%
    opencode        8        3.9          122.4 s         2238 ms           2.0%  (some hit 120 s)
Measured 2026-12-01 (2 cores, load average 6.4-8.7 after a training run; --n 8, --max-steps 3,
c=4; mini-swe-agent[litellm] is mini-swe-agent with its own litellm model client, as before
issue 18; mini-swe-agent is Harness's default since, agents/in_sandbox/harness_mswea_model.py):
    agent                     c   rollouts/min   median total   median harness   harness / total
    mini-swe-agent[litellm]   4        9.3           25.2 s          383 ms           1.6%
    mini-swe-agent            4       68.3            3.5 s          335 ms           9.4%
    opencode                  4        5.9           39.7 s          884 ms           2.2%
    claude-code               4       46.3            5.1 s          446 ms           8.4%
    codex                     4       71.7            3.2 s          658 ms          19.8%
The same day on a quiet machine (load 0.7): mini-swe-agent[litellm] 6.2 (c=1) and 10.6 (c=4)
rollouts/min, mini-swe-agent 44.6 (c=1) and 75.6 (c=4): 7.1x at c=4. opencode's own loop is
now the slowest agent by far. The harness share rises as the agents get faster; codex's is
at the target's edge under this load.
Sandbox start + teardown median: 216 ms (mini, c=1) to 447 ms (opencode, c=8) under that load,
against the 100 ms target; bench/sandbox_startup.py measures it alone. The agent CLIs dominate:
mini-swe-agent's Python start-up (litellm import) and opencode's loop, on 2 busy cores.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from capture.fake_engine import FakeEngine  # noqa: E402
from harness.service.agents.mini_swe_agent import MiniSweAgent  # noqa: E402
from harness.service.factory import HarborSessionFactory  # noqa: E402
from harness.tasks import BUNDLED_DIR  # noqa: E402

HARNESS_PHASES = ("sandbox_start", "agent_start", "verify", "fetch_trace", "teardown")


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:7.0f} ms" if values else "      - ms"


async def _batch(factory: HarborSessionFactory, n: int) -> tuple[float, list]:
    started = time.monotonic()
    results = await asyncio.gather(*(factory.rollout(seed=0) for _ in range(n)))
    return time.monotonic() - started, results


def run(agent: str, engine_url: str, n: int, concurrency: int, max_steps: int) -> dict[str, float]:
    # "mini-swe-agent[litellm]": the same agent with mini-swe-agent's own litellm model client.
    name, _, client = agent.partition("[")
    MiniSweAgent.MODEL_CLIENT = client.rstrip("]") or "direct"  # type: ignore[assignment]
    factory = HarborSessionFactory(
        None,
        split=[BUNDLED_DIR / "hello-file"],
        harness=name,
        llm_url=engine_url,
        sampling={"temperature": 1.0},
        max_steps=max_steps,
        agent_timeout_s=120,
        max_concurrent_rollouts=concurrency,
        max_attempts=1,
    )
    try:
        wall, results = asyncio.run(_batch(factory, n))
    finally:
        factory.close()
    causes = {r.cause for r in results}
    timings = [r.timings for r in results]
    harness = [sum(t.get(p, 0.0) for p in HARNESS_PHASES) for t in timings]
    totals = [t["total"] for t in timings]
    row = {
        "per_min": n / wall * 60,
        "total": statistics.median(totals),
        "agent": statistics.median(t.get("agent_run", 0.0) for t in timings),
        "harness": statistics.median(harness),
        "ratio": sum(harness) / sum(totals),
        "start_stop": statistics.median(
            t.get("sandbox_start", 0) + t.get("teardown", 0) for t in timings
        ),
    }
    phases = "  ".join(f"{p} {_ms([t[p] for t in timings if p in t])}" for p in HARNESS_PHASES)
    print(
        f"{agent:24s} c={concurrency}  {row['per_min']:6.1f} rollouts/min  "
        f"total {row['total']:5.2f} s  agent {row['agent']:5.2f} s  harness "
        f"{row['harness'] * 1000:5.0f} ms  ratio {row['ratio']:5.1%}  causes {sorted(causes)}"
    )
    print(f"{'':24s}      {phases}")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--agents", nargs="+", default=["mini-swe-agent[litellm]", "mini-swe-agent", "opencode"],
        help="agent names; mini-swe-agent[litellm] runs it with its own litellm model client",
    )
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 4, 8])
    parser.add_argument("--n", type=int, default=8, help="rollouts per (agent, concurrency)")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with FakeEngine(token_delay_s=args.token_delay_ms / 1000) as engine:
        rows = {
            (a, c): run(a, engine.url, args.n, c, args.max_steps)
            for a in args.agents
            for c in args.concurrency
        }
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    top = max(args.concurrency)
    for agent in args.agents:
        row = rows[(agent, top)]
        verdict = "meets" if row["ratio"] < 0.20 else "misses"
        print(
            f"{agent}: harness overhead {row['ratio']:.1%} of rollout wall time at c={top} "
            f"({verdict} the < 20% target); sandbox start + teardown median "
            f"{row['start_stop'] * 1000:.0f} ms"
        )


if __name__ == "__main__":
    main()
