"""Every rollout of a run, on disk: its trace, its outcome, its cause. And the end-of-run summary.

`RecordingFactory` wraps a `HarborSessionFactory`: each finished rollout is written to
`<run>/rollouts/<n>-<task>.json` (cause, rewards, error, timings, the outcome's tool counts and
the full TrainingTrace) and one line to `<run>/rollouts.jsonl`, before the trainer sees it. So a
crash, a Ctrl-C or a reward function that raises never loses a rollout already paid for, and
"why did step 3 get no gradient" is answered by reading files, not by rerunning.

Each record names the engine weight versions its calls were stamped with (`weight_versions`, from
the trace's turns: the version when each call started and ended), so the before/after evaluation
can show which weights it sampled (harness.run.learning). `split_trained()` tells the rollouts the
training steps consumed from those that finished ahead for a step that never ran.

`summary_tables()` turns the run's records and the trainer's step metrics into the tables the
train and eval commands print: rollouts by cause, reward per step, tokens trained, time per phase.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.shared.errors import CAUSES
from harness.shared.tables import add_columns

__all__ = ["RecordingFactory", "joins_by_agent", "reasoning_tokens", "result_record",
           "split_trained", "summary_tables", "trace_joins", "weight_versions"]

JOINS = ("extended", "branched", "rewritten", "new_root")  # capture.placement's, in its order


def weight_versions(trace: dict[str, Any] | None) -> list[int | None]:
    """The weight versions a trace's engine calls were stamped with, start and end, sorted (None
    first: a call with no stamp); [] for a rollout that made no call."""
    stamps = {turn.get("metadata", {}).get(key) for turn in (trace or {}).get("turns") or ()
              for key in ("weight_version_start", "weight_version_end")}
    return sorted(stamps, key=lambda v: (v is not None, v or 0))


def trace_joins(trace: dict[str, Any] | None) -> dict[str, int]:
    """How a trace's calls joined the rollout graph (each turn's metadata `join`, written by
    capture.placement): extended the call before, branched off an earlier one, started a
    rewritten-history row, or started a new root. A trace from before the field counts nothing."""
    counts = dict.fromkeys(JOINS, 0)
    for turn in (trace or {}).get("turns") or ():
        join = turn.get("metadata", {}).get("join")
        if join in counts:
            counts[join] += 1
    return counts


def reasoning_tokens(trace: dict[str, Any] | None) -> int:
    """Completion tokens the engine's reasoning parser counted as reasoning, over a trace's calls
    (vLLM's `usage.completion_tokens_details.reasoning_tokens`; 0 without a parser)."""
    total = 0
    for turn in (trace or {}).get("turns") or ():
        details = (turn.get("metadata", {}).get("usage") or {}).get("completion_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("reasoning_tokens"), int):
            total += details["reasoning_tokens"]
    return total


def joins_by_agent(records: list[dict[str, Any]], agent: str) -> dict[str, dict[str, int]]:
    """summary.json's `joins`: the run's join counts summed, under the agent that made them."""
    total = dict.fromkeys(JOINS, 0)
    for record in records:
        for kind, n in (record.get("joins") or {}).items():
            total[kind] = total.get(kind, 0) + n
    return {agent: total}


def split_trained(records: list[dict[str, Any]], steps: int, groups_per_step: int
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rollouts of the groups steps 1..`steps` consumed, the others). A training rollout's seed is
    its group (trainer.producer). The producer dispatches groups ahead of the trainer; it stops at
    the last step's groups (`end_group`), but a source driven otherwise (or an older trainer) can
    finish rollouts of groups no step took: recorded, never trained, so counted apart."""
    consumed = steps * groups_per_step
    trained: list[dict[str, Any]] = []
    ahead: list[dict[str, Any]] = []
    for record in records:
        seed = record.get("seed")
        (trained if isinstance(seed, int) and seed < consumed else ahead).append(record)
    return trained, ahead


def result_record(result: Any, index: int) -> dict[str, Any]:
    """A JSON-ready dict of one RolloutResult (the trace as OpenEnv's own dump)."""
    outcome = result.outcome
    trace = None if result.trace is None else result.trace.model_dump(mode="json")
    return {
        "index": index,
        "task_id": result.task_id,
        "seed": result.seed,
        "episode_id": result.episode_id,
        "cause": result.cause,
        "env_reward": result.env_reward,
        "rewards": result.rewards,
        "error": result.error,
        "attempts": result.attempts,
        "timings": result.timings,
        "verifier_output": getattr(result, "verifier_output", None),
        "outcome": None if outcome is None else {
            "tool_call_count": outcome.tool_call_count,
            "tool_failure_count": outcome.tool_failure_count,
            "tool_calls_by_name": outcome.tool_calls_by_name,
            "timed_out": outcome.timed_out,
            "completion": outcome.completion,
        },
        "weight_versions": weight_versions(trace),
        "joins": trace_joins(trace),
        "reasoning_tokens": reasoning_tokens(trace),
        "trace": trace,
    }


class RecordingFactory:
    """A session factory that writes every rollout to the run dir before handing it on."""

    def __init__(self, factory: Any, run_dir: Path) -> None:
        self.factory = factory
        self.dir = run_dir / "rollouts"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index_path = run_dir / "rollouts.jsonl"
        self.records: list[dict[str, Any]] = []
        self._lock = asyncio.Lock()

    def __getattr__(self, name: str) -> Any:  # create(), counts, close()... go to the factory
        return getattr(self.factory, name)

    async def rollout(self, task: Any = None, seed: int | None = None,
                      episode_id: str | None = None) -> Any:
        result = await self.factory.rollout(task=task, seed=seed, episode_id=episode_id)
        async with self._lock:
            index = len(self.records)
            record = result_record(result, index)
            slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(result.task_id))[:60]
            path = self.dir / f"{index:05d}-{slug}.json"
            await asyncio.to_thread(path.write_text, json.dumps(record, indent=1))
            light = {k: v for k, v in record.items() if k not in ("trace", "outcome")}
            light["finished_at"] = time.time()
            light["file"] = path.name
            with self.index_path.open("a") as index_file:
                index_file.write(json.dumps(light) + "\n")
            self.records.append(light)
        return result


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary_tables(records: list[dict[str, Any]], history: list[dict[str, float]],
                   timings: dict[str, float]) -> list[Table]:
    """Rollouts by cause; reward, loss and tokens per step; time per phase."""
    causes = Table(title="Rollouts by cause")
    add_columns(causes, "cause", "rollouts", right={"rollouts"})
    counts: dict[str, int] = {}
    for record in records:
        counts[record["cause"]] = counts.get(record["cause"], 0) + 1
    for cause in CAUSES:
        causes.add_row(cause, str(counts.pop(cause, 0)))
    for cause, n in counts.items():
        causes.add_row(cause, str(n))
    causes.add_row("total", str(len(records)), style="bold")
    tables = [causes]

    if history:
        steps = Table(title="Training steps")
        headers = ("step", "reward mean", "loss", "tokens trained", "groups skipped", "sync s")
        add_columns(steps, *headers, right=headers)
        for i, m in enumerate(history, start=1):
            steps.add_row(str(int(m.get("step", i))), _fmt(m.get("reward/mean")), _fmt(m.get("loss"), 4),
                          str(int(m.get("tokens/trained", 0))),
                          str(int(sum(v for k, v in m.items() if k.startswith("groups/skipped/")))),
                          _fmt(m.get("time/weight_sync_s"), 2))
        tables.append(steps)

    phases = Table(title="Time per phase (s)")
    add_columns(phases, "phase", "seconds", right={"seconds"})
    for name, seconds in timings.items():
        phases.add_row(name, f"{seconds:.1f}")
    per_rollout: dict[str, list[float]] = {}
    for record in records:
        for phase, seconds in (record.get("timings") or {}).items():
            per_rollout.setdefault(phase, []).append(seconds)
    for phase, values in per_rollout.items():
        phases.add_row(f"rollout {phase} (mean)", f"{sum(values) / len(values):.1f}")
    tables.append(phases)
    return tables
