"""What a rollout service sends back, read on the trainer's side without openenv.

Why it exists: the service validated each trace (OpenEnv's TrainingTrace) before sending it, and
the trainer's process cannot import openenv, so a trace travels as its JSON dump (`JsonTrace`,
with the `.turns` and `.to_trace_entries()` that trainer/rows.py reads) and a whole rollout as
`RemoteRolloutResult`, a `harness.shared.rollout.RolloutResult` with the service's URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from harness.shared.errors import CAUSES
from harness.shared.outcome import HarnessRolloutOutcome
from harness.shared.rollout import RolloutResult

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
class RemoteRolloutResult(RolloutResult):
    """A `harness.shared.rollout.RolloutResult` from a service: its trace a `JsonTrace` (read
    without openenv), no task id when the service never picked one, and which service ran it."""

    task_id: str | None = None
    trace: JsonTrace | None = None  # type: ignore[assignment]
    service: str | None = None

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
