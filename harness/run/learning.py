"""Instruments that show whether a training run learned: before/after evaluation and reward curve.

Why it exists (issue 18): a loop with a sign error, a wrong mask or a weight push that never
lands still runs to the end and prints a loss. What tells them apart is the held-out pass rate
before and after training, and the same run with shuffled rewards (`--shuffle-rewards`, the
control) as its falsification check. This module holds the logic; `harness.train` calls it.

    learning = BeforeAfter(settings, make_factory, run_dir, console, eval_tasks=names)
                             # names: --eval-tasks as the rollout service loads it
    learning.before()        # --eval-tasks at the engine's initial weights
    ...train...              # the weight sync pushes every step's weights into the same engine
    learning.after()         # the same tasks and seeds; prints the table, writes before_after.json
    learning.curve(history)  # every run: reward_curve.json + .png; before_after.png with after()

`make_factory(split, sampling)` makes the session factory the evaluation runs on: in
`harness.train` a RemoteSessionFactory on the run's rollout services (the same services, proxy
and engine as training, so "after" samples the pushed weights), anything with `rollout()`
otherwise. The evaluation samples as the trainer does (T as trained, top_p 1, no top_k), the same
agent, sandbox, caps and seeds before and after, and writes its rollouts under <run>/eval-before
and <run>/eval-after, apart from the training rollouts. A pass is env_reward >= 1 (harness.eval);
unscored rollouts are counted apart, never as fails.

`write_reward_curve()` writes <run>/reward_curve.json (per step: reward mean, verifier reward
mean when reward functions shape it, rollouts scored, whether rewards were shuffled) and
<run>/reward_curve.png; `write_before_after_chart()` draws <run>/before_after.png (per task and
overall, before vs after, with the change) from before_after.json. Both charts are matplotlib
(harness/run/plots.py) with axes, labels, a title and a legend; the JSON beside each holds the numbers.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.shared.lookup_rates import by_instruction, step_rates_of_folder
from harness.shared.run_config import RunSettings
from harness.shared.tables import PASS_THRESHOLD, add_columns, pass_rate_table

__all__ = ["BeforeAfter", "before_after_problems", "before_after_table", "evaluate_split",
           "reward_curve", "reward_series", "step_rates_table", "write_before_after_chart",
           "write_reward_curve"]


class BeforeAfter:
    """The before/after evaluation and reward curve around one training run (harness.train)."""

    def __init__(self, settings: RunSettings, make_factory: Any, run_dir: Path,
                 console: Any, *, eval_tasks: list | None) -> None:
        """`eval_tasks`: the --eval-tasks split as loaded where rollouts run (harness.train asks
        its rollout service for the names: this process never loads tasks, which needs harbor);
        None or [] when the run has no --eval-tasks."""
        self.settings, self.make_factory = settings, make_factory
        self.run_dir, self.console = run_dir, console
        self.tasks: list = list(eval_tasks or [])
        self.summaries: dict[str, dict] = {}

    def _evaluate(self, label: str) -> None:
        if not self.tasks:
            return
        n = len(self.tasks) * self.settings.eval_rollouts_per_task
        self.console.print(f"[bold]eval {label}[/] {n} rollouts on {self.settings.eval_tasks}")
        self.summaries[label] = summary = evaluate_split(
            self.make_factory, self.settings, self.tasks, self.run_dir, label,
            split=self.settings.eval_tasks)
        self.console.print(f"[bold]eval {label}[/] pass rate {_pct(_rate(summary))} "
                           f"({summary['passed']}/{summary['scored']} scored)")

    def before(self) -> None:
        self._evaluate("before")

    def record_weights(self, last_version: int) -> list[str]:
        """Add each evaluation rollout's weight versions, and their check against version 0
        before and `last_version` after, to the before_after.json `after()` wrote; the problems
        found ([] when none: harness.run.eval_weights raises EvaluationWeightsError with them)."""
        from harness.run.eval_weights import weight_check

        path = self.run_dir / "before_after.json"
        if not path.exists():
            return []
        data = json.loads(path.read_text())
        data.update(weight_check(self.summaries, last_version))
        path.write_text(json.dumps(data, indent=1))
        return data["weight_check"]["problems"]

    def after(self) -> dict | None:
        """Evaluate again, print the table, write <run>/before_after.json; its data (or None)."""
        self._evaluate("after")
        if "before" not in self.summaries or "after" not in self.summaries:
            return None
        before, after = (by_instruction(self.summaries[k]) for k in ("before", "after"))
        table, data = before_after_table(before, after, title=_title(self.settings.eval_tasks))
        data.update(eval_tasks=self.settings.eval_tasks,
                    shuffled_rewards=self.settings.shuffle_rewards,
                    flipped_rewards=self.settings.flip_rewards,
                    learning_rate=self.settings.learning_rate, seed=self.settings.seed)
        steps_table = None
        if self.summaries["before"].get("step_rates") or self.summaries["after"].get("step_rates"):
            steps_table, data["step_rates"] = step_rates_table(
                self.summaries["before"].get("step_rates"), self.summaries["after"].get("step_rates"))
        (self.run_dir / "before_after.json").write_text(json.dumps(data, indent=1))
        self.console.print(table)
        if steps_table is not None:
            self.console.print(steps_table)
        return data

    def curve(self, history: list[dict[str, float]]) -> None:
        """reward_curve.json + .png (every run); before_after.png when after() wrote its JSON."""
        _, png = write_reward_curve(self.run_dir, history, shuffled=self.settings.shuffle_rewards)
        self.console.print(f"[bold]reward curve[/] {png} (data: reward_curve.json)")
        if (chart := write_before_after_chart(self.run_dir)) is not None:
            self.console.print(f"[bold]before/after chart[/] {chart} (data: before_after.json)")


def before_after_problems(settings: RunSettings) -> list[str]:
    """Problems with --eval-tasks and its companions, each with its fix (for harness.run.preflight)."""
    if settings.eval_tasks is None:
        return []
    problems = []
    if not settings.weight_sync:
        problems.append("--eval-tasks with --no-weight-sync: the engine would still serve the "
                        "initial weights after training, so 'after' would measure the untrained "
                        "model; drop --no-weight-sync or --eval-tasks")
    if settings.eval_rollouts_per_task < 1:
        problems.append(f"--eval-rollouts-per-task {settings.eval_rollouts_per_task}: use >= 1")
    return problems


async def _gather(factory: Any, n_tasks: int, per_task: int) -> None:
    from harness.shared.seeds import eval_rollouts

    # One seed and name per (task, repeat), the same before and after (harness.shared.seeds).
    await asyncio.gather(*(factory.rollout(seed=seed, episode_id=episode_id)
                           for seed, episode_id in eval_rollouts(n_tasks, per_task)))


def evaluate_split(make_factory: Any, settings: RunSettings, tasks: list, run_dir: Path,
                   label: str, *, split: Any = None) -> dict:
    """Run --eval-rollouts-per-task rollouts of every task; the pass-rate summary.

    `make_factory(split, sampling)` makes the session factory (see the module docstring), given
    `split` (default: `tasks` itself; harness.train passes the --eval-tasks spec, which the
    service loads in the same order) and the trainer's sampling policy. Its engine serves
    whatever weights it holds now, so call it before the first step and after the last push.
    """
    from harness.run.eval_weights import rollout_versions
    from harness.shared.run_records import RecordingFactory

    # The trainer's policy (AsyncGRPOConfig.sampling), as harness.eval writes it: harness/ does
    # not import trainer/ outside harness/train.py.
    sampling = {"temperature": settings.temperature, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                "max_tokens": settings.max_tokens, "seed": settings.seed}
    out = run_dir / f"eval-{label}"
    factory = RecordingFactory(make_factory(tasks if split is None else split, sampling), out)

    async def run() -> None:
        try:
            await _gather(factory, len(tasks), settings.eval_rollouts_per_task)
        finally:
            if hasattr(factory.factory, "aclose"):  # its HTTP clients live on this loop
                await factory.factory.aclose()

    try:
        asyncio.run(run())
    finally:
        factory.close()
    _, summary = pass_rate_table(factory.records)
    summary["label"] = label
    summary["step_rates"] = step_rates_of_folder(out, pass_threshold=PASS_THRESHOLD)
    summary["causes"] = {c: sum(r["cause"] == c for r in factory.records)
                         for c in sorted({r["cause"] for r in factory.records})}
    summary["rollouts"] = rollout_versions(factory.records)  # the weights each one sampled
    (out / "eval_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _title(eval_tasks: str | None) -> str:
    return "Test pass rate" if (eval_tasks or "").endswith(":test") else "Held-out pass rate"


def step_rates_table(before: dict | None, after: dict | None) -> tuple[Table, dict]:
    """The lookup family's per-step rates (harness.shared.lookup_rates) before and after."""
    table = Table(title="What was learned, step by step: before -> after")
    add_columns(table, "step", "before", "after", "change", right={"before", "after", "change"})
    labels = {"looked": "1. looked at the source file first",
              "used_observation": "2. wrote the word the file showed",
              "passed": "3. final answer right (verifier)"}
    for key, label in labels.items():
        b, a = (before or {}).get(key), (after or {}).get(key)
        change = "-" if b is None or a is None else f"{(a - b) * 100:+.1f} points"
        table.add_row(label, _pct(b), _pct(a), change)
    table.caption = (f"scored rollouts: {(before or {}).get('n', 0)} before, "
                     f"{(after or {}).get('n', 0)} after; a guess of the word is right 1 in 8")
    return table, {"before": before, "after": after}


def _rate(row: dict) -> float | None:
    return row["passed"] / row["scored"] if row.get("scored") else None


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def before_after_table(before: dict, after: dict, *, title: str = "Held-out pass rate"
                       ) -> tuple[Table, dict]:
    """Per-task and overall passes before and after, with the change in points."""
    table = Table(title=f"{title}: before -> after training")
    add_columns(table, "task", "before", "after", "change", right={"before", "after", "change"})
    tasks = sorted(set(before["per_task"]) | set(after["per_task"]))
    empty = {"passed": 0, "scored": 0, "unscored": 0}
    rows = {}
    for task in tasks:
        b, a = before["per_task"].get(task, empty), after["per_task"].get(task, empty)
        rb, ra = _rate(b), _rate(a)
        change = None if rb is None or ra is None else (ra - rb) * 100
        rows[task] = {"before": b, "after": a, "change_points": change}
        table.add_row(task, f"{b['passed']}/{b['scored']}", f"{a['passed']}/{a['scored']}",
                      "-" if change is None else f"{change:+.0f}")
    rb, ra = _rate(before), _rate(after)
    change = None if rb is None or ra is None else (ra - rb) * 100
    table.add_row("overall", f"{before['passed']}/{before['scored']} ({_pct(rb)})",
                  f"{after['passed']}/{after['scored']} ({_pct(ra)})",
                  "-" if change is None else f"{change:+.1f} points", style="bold")
    unscored = before.get("unscored", 0) + after.get("unscored", 0)
    if unscored:
        table.caption = f"{unscored} unscored rollout(s) left out of the rates"
    data = {"before_pass_rate": rb, "after_pass_rate": ra, "change_points": change,
            "pass_threshold": PASS_THRESHOLD, "per_task": rows,
            "before": before, "after": after}
    return table, data


def reward_curve(history: list[dict[str, float]], *, shuffled: bool) -> dict:
    """Per-step reward figures from the trainer's metrics history (trainer.grpo's dicts)."""
    steps = [int(m.get("step", i)) for i, m in enumerate(history, start=1)]
    curve: dict[str, Any] = {
        "steps": steps,
        "reward_mean": [m.get("reward/mean") for m in history],
        "rollouts_scored": [m.get("reward/scored") for m in history],
        "shuffled_rewards": shuffled,
    }
    if any("rollout/correctness_mean" in m for m in history):  # shaped: the verifier's part too
        curve["env_reward_mean"] = [m.get("rollout/correctness_mean") for m in history]
    return curve


def write_reward_curve(run_dir: Path, history: list[dict[str, float]], *, shuffled: bool
                       ) -> tuple[Path, Path]:
    """<run>/reward_curve.json and <run>/reward_curve.png; returns their paths."""
    from harness.run.plots import line_figure, save_png

    curve = reward_curve(history, shuffled=shuffled)
    json_path, png_path = run_dir / "reward_curve.json", run_dir / "reward_curve.png"
    json_path.write_text(json.dumps(curve, indent=1))
    save_png(line_figure(curve["steps"], reward_series(curve), xlabel="training step",
                         ylabel="mean reward of the step's rollouts",
                         title="Training reward per step"
                         + (" (shuffled-reward control)" if shuffled else "")), png_path)
    return json_path, png_path


def reward_series(curve: dict) -> dict[str, list]:
    """The lines reward_curve.png draws, by legend label (reward_curve()'s dict)."""
    series = {"reward mean" + (" (shuffled)" if curve.get("shuffled_rewards") else ""):
              curve["reward_mean"]}
    if "env_reward_mean" in curve:
        series["verifier reward mean (pass = 1)"] = curve["env_reward_mean"]
    return series


def write_before_after_chart(run_dir: Path) -> Path | None:
    """<run>/before_after.png from <run>/before_after.json (None when there is none)."""
    from harness.run.plots import before_after_figure, save_png

    source = run_dir / "before_after.json"
    if not source.exists():
        return None
    data = json.loads(source.read_text())
    title = f"Held-out pass rate ({data.get('eval_tasks') or 'eval tasks'})"
    if data.get("shuffled_rewards"):
        title += ", shuffled-reward control"
    return save_png(before_after_figure(data, title=title), run_dir / "before_after.png")
