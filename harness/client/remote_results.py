"""What a rollout service sends back, read on the trainer's side without openenv.

Why it exists: the service validated each trace (OpenEnv's TrainingTrace) before sending it, and
the trainer's process cannot import openenv, so a trace travels as its JSON dump (`JsonTrace`,
with the `.turns` and `.to_trace_entries()` that trainer/rows.py reads) and a whole rollout as
`RemoteRolloutResult`, the fields of `harness.shared.rollout.RolloutResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from harness.shared.errors import CAUSES, TRAINABLE_CAUSES, Cause
from harness.shared.outcome import HarnessRolloutOutcome

__all__ = ["JsonTrace", "RemoteRolloutResult"]


class JsonTrace:
    """A TrainingTrace the service validated, as its JSON dump (no openenv needed to read it)."""

    def __init__(self, dump: dict[str, Any], entries: list[dict[str, Any]] | None = None) -> None:
        if not isinstance(dump, dict) or not isinstance(dump.get("turns"), list):
            raise ValueError("a TrainingTrace dump needs a 'turns' list")
        self._dump = dump
        self._entries = entries or []
        self.turns = [SimpleNamespace(**t) if isinstance(t, dict) else t for t in dump["turns"]]
        self.schema_version = dump.get("schema_version")

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return self._dump

    def to_trace_entries(self) -> list[dict[str, Any]]:
        return list(self._entries)


@dataclass
class RemoteRolloutResult:
    """`harness.shared.rollout.RolloutResult`'s fields, from a service (plus which service ran it)."""

    cause: Cause
    task_id: str | None = None
    seed: int | None = None
    episode_id: str | None = None
    trace: JsonTrace | None = None
    outcome: HarnessRolloutOutcome | None = None
    env_reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    verifier_output: str | None = None
    service: str | None = None

    @property
    def trainable(self) -> bool:
        return self.cause in TRAINABLE_CAUSES and self.trace is not None

    @classmethod
    def from_json(cls, body: dict[str, Any], service: str) -> RemoteRolloutResult:
        trace = None if body.get("trace") is None else JsonTrace(body["trace"], body.get("entries"))
        o = body.get("outcome")
        outcome = None if o is None else HarnessRolloutOutcome(
            env_reward=o["env_reward"], completion=o["completion"],
            trace=trace.to_trace_entries() if trace else [], tool_call_count=o["tool_call_count"],
            tool_failure_count=o["tool_failure_count"],
            tool_calls_by_name=o["tool_calls_by_name"], timed_out=o["timed_out"])
        if body.get("cause") not in CAUSES:
            raise ValueError(f"service {service} sent an unknown cause {body.get('cause')!r}")
        return cls(cause=body["cause"], task_id=body.get("task_id"), seed=body.get("seed"),
                   episode_id=body.get("episode_id"), trace=trace, outcome=outcome,
                   env_reward=body.get("env_reward"), rewards=dict(body.get("rewards") or {}),
                   error=body.get("error"), attempts=int(body.get("attempts") or 1),
                   timings=dict(body.get("timings") or {}),
                   verifier_output=body.get("verifier_output"), service=service)
