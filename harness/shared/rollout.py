"""`RolloutResult`: what one rollout hands back, whatever happened to it.

The factory's `rollout()` never raises for a rollout failure: it returns one of these with a
`cause`, so a trainer can count every rollout and train only the trainable ones. Nothing is
dropped silently: an infra failure after its retries is still a result, with its error text.

Glossary (DESIGN.md words): a *rollout* is one agent run on one task; its *trace* is the
capture proxy's `TrainingTrace` (one turn per engine call); its *outcome* is what the trainer's
reward function sees (`harness.shared.outcome.HarnessRolloutOutcome`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.shared.errors import TRAINABLE_CAUSES, Cause

if TYPE_CHECKING:
    from openenv.core.harness.training import TrainingTrace

    from harness.shared.outcome import HarnessRolloutOutcome

__all__ = ["RolloutResult"]


@dataclass
class RolloutResult:
    """One rollout's result.

    cause:      ok (reward > 0) | model_failure (agent ran, reward <= 0) | timeout (stopped at its
                time or step limit, captured turns kept) | tampered (the agent kept its grade from
                being fair: env_reward 0.0, trained, in the baseline) | infra_failure (after
                retries, or the proxy recorded engine/proxy failures) | verifier_failure (the
                grader fails on a fresh sandbox of the task too, or the sandbox broke).
    trace:      the validated TrainingTrace, or None when nothing was captured / trainable.
    outcome:    HarnessRolloutOutcome built from the trace (None when there is no trace).
    env_reward: the selected reward key's value; None means unscored, never 0.0.
    rewards:    every key the verifier wrote (reward.json may hold several).
    attempts:   1 + the number of infra retries spent on this rollout.
    timings:    seconds per phase of the last attempt: sandbox_start, agent_start, agent_run,
                verify, fetch_trace, teardown, total (plus backoff_s when retried).
    """

    cause: Cause
    task_id: str
    seed: int | None = None
    episode_id: str | None = None
    trace: TrainingTrace | None = None
    outcome: HarnessRolloutOutcome | None = None
    env_reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    verifier_output: str | None = None  # tail of the grader's stdout/stderr (harness/service/session_grading.py)

    @property
    def trainable(self) -> bool:
        """True when the trace is a sample of the policy (see TRAINABLE_CAUSES) and exists."""
        return self.cause in TRAINABLE_CAUSES and self.trace is not None
