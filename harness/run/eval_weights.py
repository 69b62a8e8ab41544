"""Which weights the before/after evaluation sampled, and a loud failure when they were wrong.

Why (issue 32): "after" is meant to measure the last weights the trainer pushed, "before" the
starting ones. A push that never reached a rollout service's proxy, an evaluation started before
the last push landed, or a service still stamping an earlier run's version would each print a
before/after table of the wrong model with nothing failing. The capture stamps every engine call
with the weight version its proxy was told (`weight_version_start` / `_end` in the trace), and
harness.shared.run_records lists them per rollout (`weight_versions`); this module checks them:

    before   every call of every rollout stamped with the starting version (0)
    after    every call stamped with the last version the engine confirmed (the weight sync's)

A rollout that made no engine call sampled nothing and passes. A call without a stamp fails: its
weights are unknown. harness.train has BeforeAfter.record_weights write both into
before_after.json (`weight_versions`: per side, each rollout's task, name and versions;
`weight_check`: what was expected and the problems), and exits 1 with `EvaluationWeightsError`
once its records and summary are written.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EvaluationWeightsError", "rollout_versions", "weight_check", "weight_version_problems"]


class EvaluationWeightsError(RuntimeError):
    """The before/after evaluation sampled weights other than the ones it reports on."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("the before/after evaluation did not sample the weights it reports on: "
                         + "; ".join(problems) + " (before_after.json `weight_check` lists every "
                         "rollout's versions; its pass rates are not the model's)")


def rollout_versions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each evaluation rollout's task, name and weight versions, from harness.shared.run_records."""
    return [{"task_id": r.get("task_id"), "episode_id": r.get("episode_id"),
             "weight_versions": r.get("weight_versions", [])} for r in records]


def weight_version_problems(rollouts: list[dict[str, Any]], expected: int, label: str
                            ) -> list[str]:
    """One problem naming the rollouts of `label` whose calls carried a version but `expected`."""
    wrong = [r for r in rollouts if any(v != expected for v in r["weight_versions"])]
    if not wrong:
        return []
    seen = sorted({v for r in wrong for v in r["weight_versions"]}, key=lambda v: (v is not None, v or 0))
    first = wrong[0]
    return [f"eval {label}: {len(wrong)} of {len(rollouts)} rollouts sampled weight versions "
            f"{seen} where {expected} was expected (e.g. {first['task_id']} {first['episode_id']}: "
            f"{first['weight_versions']})"]


def weight_check(summaries: dict[str, dict[str, Any]], last_version: int) -> dict[str, Any]:
    """before_after.json's `weight_versions` and `weight_check` from the evaluation summaries
    (harness.run.learning.evaluate_split's, each with its `rollouts`)."""
    versions = {label: summaries[label]["rollouts"] for label in ("before", "after")}
    problems = (weight_version_problems(versions["before"], 0, "before")
                + weight_version_problems(versions["after"], last_version, "after"))
    return {"weight_versions": versions,
            "weight_check": {"before_expected": 0, "after_expected": last_version,
                             "problems": problems}}
