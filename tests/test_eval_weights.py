"""The before/after evaluation records the weights it sampled and fails loudly on the wrong ones,
and the run summary counts the rollouts it trained apart from those finished ahead (issue 32).

The evaluation runs through the real BeforeAfter, evaluate_split and RecordingFactory on a factory
whose rollouts carry traces stamped as the capture stamps them (weight_version_start / _end per
call); the stamps are the input here, chosen per case. That the real proxy stamps the last pushed
version is checked end to end in test_trainer_isolation.py's train command.

Run: .venv/bin/python -m pytest tests/test_eval_weights.py -q
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.run.eval_weights import EvaluationWeightsError
from harness.run.learning import BeforeAfter
from harness.shared.rollout import RolloutResult
from harness.shared.run_config import RunSettings
from harness.shared.run_records import split_trained, weight_versions

TASKS = ["task-a", "task-b"]


class _Trace:
    """A trace as result_record dumps it: one turn per (start, end) stamp."""

    def __init__(self, stamps: list[tuple[Any, Any]]) -> None:
        self.stamps = stamps

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return {"schema_version": 1, "turns": [
            {"metadata": {"weight_version_start": a, "weight_version_end": b}}
            for a, b in self.stamps]}


class _Factory:
    """Rollouts of TASKS whose calls carry `stamps(label, episode_id)`."""

    def __init__(self, label: str, stamps: Any) -> None:
        self.label, self.stamps = label, stamps

    async def rollout(self, task: Any = None, seed: int | None = None,
                      episode_id: str | None = None) -> RolloutResult:
        assert seed is not None
        calls = self.stamps(self.label, episode_id)
        return RolloutResult(cause="ok", task_id=TASKS[seed % len(TASKS)], seed=seed,
                             episode_id=episode_id, env_reward=1.0,
                             trace=_Trace(calls) if calls else None)

    def close(self) -> None:
        pass


def _run(tmp_path: Path, stamps: Any, last_version: int) -> tuple[list[str], dict]:
    """The evaluation as harness.train runs it: before, after, record_weights; the problems and
    before_after.json."""
    settings = RunSettings(eval_tasks="family:heldout", eval_rollouts_per_task=2)
    labels = iter(["before", "after"])
    learning = BeforeAfter(settings, lambda split, sampling: _Factory(next(labels), stamps),
                           tmp_path, Console(file=io.StringIO()), eval_tasks=TASKS)
    learning.before()
    assert learning.after() is not None
    problems = learning.record_weights(last_version)
    data = json.loads((tmp_path / "before_after.json").read_text())
    assert data["weight_check"]["problems"] == problems
    assert "before_pass_rate" in data  # what after() wrote is kept
    return problems, data


def test_before_after_json_names_the_weights_every_rollout_sampled(tmp_path: Path):
    problems, data = _run(tmp_path, lambda label, _: [(0, 0)] * 2 if label == "before"
                          else [(3, 3)] * 3, last_version=3)
    assert data["weight_check"] == {"before_expected": 0, "after_expected": 3, "problems": []}
    for label, version in (("before", 0), ("after", 3)):
        rollouts = data["weight_versions"][label]
        assert sorted(r["episode_id"] for r in rollouts) == ["t0-r0", "t0-r1", "t1-r0", "t1-r1"]
        assert {r["task_id"] for r in rollouts} == set(TASKS)
        assert all(r["weight_versions"] == [version] for r in rollouts)
    assert problems == []


@pytest.mark.parametrize("case, stamps, wanted", [
    ("an after rollout straddled the last push",
     lambda label, ep: [(0, 0)] if label == "before" else [(3, 3), (2, 3)] if ep == "t1-r0"
     else [(3, 3)],
     "eval after: 1 of 4 rollouts sampled weight versions [2, 3] where 3 was expected "
     "(e.g. task-b t1-r0: [2, 3])"),
    ("the after side never heard the last push",
     lambda label, _: [(0, 0)] if label == "before" else [(2, 2)],
     "eval after: 4 of 4 rollouts sampled weight versions [2] where 3 was expected"),
    ("the before side sampled a version an earlier run left",
     lambda label, ep: [(7, 7)] if label == "before" and ep == "t0-r1" else
     [(0, 0)] if label == "before" else [(3, 3)],
     "eval before: 1 of 4 rollouts sampled weight versions [7] where 0 was expected"),
    ("a call without a stamp",
     lambda label, ep: [(0, 0)] if label == "before" else [(None, 3)] if ep == "t0-r0"
     else [(3, 3)],
     "eval after: 1 of 4 rollouts sampled weight versions [None, 3] where 3 was expected"),
])
def test_an_evaluation_of_the_wrong_weights_fails_loudly_and_says_which(tmp_path: Path, case,
                                                                        stamps, wanted):
    problems, data = _run(tmp_path, stamps, last_version=3)
    [problem] = problems
    assert problem.startswith(wanted), (case, problem)
    message = str(EvaluationWeightsError(problems))
    assert "did not sample the weights" in message and problem in message


def test_a_rollout_that_made_no_call_sampled_nothing_and_passes(tmp_path: Path):
    problems, data = _run(tmp_path, lambda label, ep: [] if ep == "t1-r1" else
                          [(0, 0)] if label == "before" else [(3, 3)], last_version=3)
    assert problems == []
    assert [r["weight_versions"] for r in data["weight_versions"]["after"]
            if r["episode_id"] == "t1-r1"] == [[]]


def test_the_train_command_exits_1_with_the_problem_named(monkeypatch, capsys):
    import harness.train as train

    def wrong_weights(settings, console):
        raise EvaluationWeightsError(["eval after: 4 of 4 rollouts sampled weight versions [2]"])

    monkeypatch.setattr(train, "run_training", wrong_weights)
    assert train.main([]) == 1
    err = capsys.readouterr().err
    assert "did not sample the weights" in err and "versions [2]" in err


def test_weight_versions_are_read_from_every_call_start_and_end():
    trace = _Trace([(1, 1), (1, 2), (None, 2)]).model_dump()
    assert weight_versions(trace) == [None, 1, 2]
    assert weight_versions(None) == [] and weight_versions({"turns": []}) == []


def test_the_summary_counts_the_rollouts_trained_apart_from_those_finished_ahead():
    # 2 steps x 4 groups x 2 rollouts trained; group 8 (of a third step that never ran) had one
    # rollout finished when the run ended: the "385 rollouts for 384 trained" of issue 32.
    records = [{"seed": g, "episode_id": f"g{g}-r{k}"} for g in range(8) for k in range(2)]
    records.append({"seed": 8, "episode_id": "g8-r0"})
    trained, ahead = split_trained(records, steps=2, groups_per_step=4)
    assert len(trained) == 16 and [r["episode_id"] for r in ahead] == ["g8-r0"]
    assert split_trained(records, steps=0, groups_per_step=4) == ([], records)


def test_before_after_json_holds_the_per_step_rates_it_printed(tmp_path: Path):
    # The per-step rates were printed and then added to the data after the file was written, so
    # before_after.json of a lookup run lacked them (found in the seed-0 run of 2026-12-03).
    settings = RunSettings(eval_tasks="lookup:test", eval_rollouts_per_task=1)
    out = io.StringIO()
    learning = BeforeAfter(settings, None, tmp_path, Console(file=out, width=120), eval_tasks=[])
    rates = {"before": {"looked": 0.9, "used_observation": 0.05, "passed": 0.05, "n": 96},
             "after": {"looked": 0.95, "used_observation": 0.25, "passed": 0.2, "n": 96}}
    for label in ("before", "after"):
        learning.summaries[label] = {"passed": 1, "scored": 2, "unscored": 0, "per_task": {
            "lookup-key-answer-t0-table": {"passed": 1, "scored": 2, "unscored": 0}},
            "step_rates": rates[label]}
    data = learning.after()
    written = json.loads((tmp_path / "before_after.json").read_text())
    assert written["step_rates"] == data["step_rates"] == rates
    assert "wrote the word the file showed" in out.getvalue() and "+20.0 points" in out.getvalue()
