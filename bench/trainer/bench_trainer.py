"""Trainer benchmark (not a test): rows per second from traces, and the trainer's own overhead.

    .venv/bin/python bench/trainer/bench_trainer.py [--steps 8] [--model PATH]

1. rows/s: agent-shaped TrainingTraces (each turn's prompt extends the last by the previous
   completion and a tool result, plus one rewritten-history turn) -> `trace_to_rows`.
2. overhead: a full `HarnessAsyncGRPOTrainer` run on the tiny model fed by a ReplaySource.
   Overhead = step wall time (groups -> rows, staleness, packing, broadcast, stats; everything
   the trainer adds) minus forward/backward, optimizer and weight sync, as a fraction of the
   step. Target: under 10%. The first step (allocator and kernel warm-up) is excluded.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from trainer.fakes import ReplaySource, make_trace, make_turn  # noqa: E402
from trainer.rows import trace_to_rows  # noqa: E402


def agent_trace(rng: random.Random, *, turns: int, system: int, completion: int, tool: int,
                version: int = 0):
    held = [rng.randrange(10, 4000) for _ in range(system)]
    out = []
    for t in range(turns):
        if t == turns // 2:  # a compaction: the history is rewritten (new row)
            held = held[:system] + [rng.randrange(10, 4000) for _ in range(64)]
        comp = [rng.randrange(10, 4000) for _ in range(completion)]
        out.append(make_turn(held, comp, [-rng.uniform(0.01, 3.0) for _ in comp],
                             node_id=f"n{t}", version=version))
        held = held + comp + [rng.randrange(10, 4000) for _ in range(tool)]
    return make_trace(*out)


def bench_rows(n_traces: int = 40) -> dict[str, float]:
    rng = random.Random(0)
    traces = [agent_trace(rng, turns=20, system=2000, completion=120, tool=200)
              for _ in range(n_traces)]
    t0 = time.perf_counter()
    rows = turns = tokens = 0
    for tr in traces:
        rs, report = trace_to_rows(tr)
        rows += len(rs)
        turns += report.turns
        tokens += sum(len(r) for r in rs)
    dt = time.perf_counter() - t0
    return {"traces": n_traces, "rows_per_s": rows / dt, "traces_per_s": n_traces / dt,
            "turns_per_s": turns / dt, "row_tokens_per_s": tokens / dt,
            "prompt_tokens_per_trace": sum(len(t.prompt_token_ids) for t in traces[0].turns)}


def bench_overhead(model_path: str, steps: int) -> dict[str, float]:
    from trainer.config import AsyncGRPOConfig
    from trainer.grpo import HarnessAsyncGRPOTrainer

    def trace_fn(seed: int, k: int):
        return agent_trace(random.Random(1000 * seed + k), turns=6, system=400, completion=48,
                           tool=64)

    source = ReplaySource(trace_fn, lambda s, k: float(k % 2))
    args = AsyncGRPOConfig(num_generations=8, max_steps=steps, learning_rate=1e-5,
                           max_tokens_per_microbatch=4096, output_dir="/tmp/bench_trainer",
                           report_to="none", save_steps=10**6, max_concurrent_rollouts=16)
    trainer = HarnessAsyncGRPOTrainer(model_path, lambda sampling: source, args)
    trainer._should_save = lambda step: False  # checkpoints are not part of a step's cost
    history = trainer.train()[1:]
    med = lambda key: statistics.median(h[key] for h in history)  # noqa: E731
    return {
        "steps_measured": len(history),
        "tokens_forwarded_per_step": med("tokens/forwarded"),
        "step_s": med("time/step_s") + med("time/groups_to_rows_s"),
        "forward_backward_s": med("time/forward_backward_s"),
        "optimizer_s": med("time/optimizer_s"),
        "groups_to_rows_s": med("time/groups_to_rows_s"),
        "prepare_s": med("time/prepare_s"),
        "overhead_frac": med("time/overhead_frac"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--model", default=None, help="model dir (default: the tiny model)")
    a = ap.parse_args()
    if a.model is None:
        from launchers.tiny_model import build_tiny_model

        a.model = str(build_tiny_model())
    result = {"rows": bench_rows(), "overhead": bench_overhead(a.model, a.steps)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
