"""Instruments that show whether a training run learned: before/after evaluation and reward curve.

Why it exists (issue 18): a loop with a sign error, a wrong mask or a weight push that never
lands still runs to the end and prints a loss. What tells them apart is the held-out pass rate
before and after training, and the same run with shuffled rewards (`--shuffle-rewards`, the
control) as its falsification check. This module holds the logic; `harness.train` calls it.

    learning = BeforeAfter(settings, make_factory, run_dir, console)  # inside the RunStack
    learning.before()        # --eval-tasks at the engine's initial weights
    ...train...              # the weight sync pushes every step's weights into the same engine
    learning.after()         # the same tasks and seeds; prints the table, writes before_after.json
    learning.curve(history)  # every run: reward_curve.json + reward_curve.png

`make_factory(split, sampling)` makes the session factory the evaluation runs on: in
`harness.train` a RemoteSessionFactory on the run's rollout services (the same services, proxy
and engine as training, so "after" samples the pushed weights), anything with `rollout()`
otherwise. The evaluation samples as the trainer does (T as trained, top_p 1, no top_k), the same
agent, sandbox, caps and seeds before and after, and writes its rollouts under <run>/eval-before
and <run>/eval-after, apart from the training rollouts. A pass is env_reward >= 1 (harness.eval);
unscored rollouts are counted apart, never as fails.

`write_reward_curve()` writes <run>/reward_curve.json (per step: reward mean, verifier reward
mean when reward functions shape it, rollouts scored, whether rewards were shuffled) and
<run>/reward_curve.png: with matplotlib when it is installed, else a dependency-free raster of
the same lines (no text; the JSON beside it holds the numbers).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import zlib
from pathlib import Path
from typing import Any

from rich.table import Table

from harness.eval import PASS_THRESHOLD, pass_rate_table
from harness.run_config import RunSettings

__all__ = ["BeforeAfter", "before_after_problems", "before_after_table", "eval_task_problems",
           "evaluate_split", "reward_curve", "write_png_plot", "write_reward_curve"]


class BeforeAfter:
    """The before/after evaluation and reward curve around one training run (harness.train)."""

    def __init__(self, settings: RunSettings, make_factory: Any, run_dir: Path,
                 console: Any, *, eval_tasks: list | None = None) -> None:
        """`eval_tasks`: the --eval-tasks split as loaded where rollouts run (harness.train asks
        its rollout service for the names: its process does not import harbor); None loads it
        here."""
        self.settings, self.make_factory = settings, make_factory
        self.run_dir, self.console = run_dir, console
        self.tasks: list = list(eval_tasks or [])
        if settings.eval_tasks is not None and eval_tasks is None:
            from harness.tasks import load_tasks

            self.tasks = load_tasks(settings.eval_tasks)
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
        found ([] when none: harness.eval_weights raises EvaluationWeightsError with them)."""
        from harness.eval_weights import weight_check

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
        table, data = before_after_table(self.summaries["before"], self.summaries["after"])
        data.update(eval_tasks=self.settings.eval_tasks,
                    shuffled_rewards=self.settings.shuffle_rewards, seed=self.settings.seed)
        (self.run_dir / "before_after.json").write_text(json.dumps(data, indent=1))
        self.console.print(table)
        return data

    def curve(self, history: list[dict[str, float]]) -> None:
        _, png = write_reward_curve(self.run_dir, history, shuffled=self.settings.shuffle_rewards)
        self.console.print(f"[bold]reward curve[/] {png} (data: reward_curve.json)")


def before_after_problems(settings: RunSettings) -> list[str]:
    """Problems with --eval-tasks and its companions, each with its fix (for harness.preflight)."""
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


def eval_task_problems(settings: RunSettings) -> list[str]:
    """--eval-tasks loads here (it needs harbor: run where rollouts run, see harness.preflight)."""
    if settings.eval_tasks is None:
        return []
    from harness.tasks import load_tasks

    try:
        load_tasks(settings.eval_tasks)
    except Exception as exc:  # every loader error names its fix
        return [f"--eval-tasks {settings.eval_tasks!r}: {exc}"]
    return []


async def _gather(factory: Any, n_tasks: int, per_task: int) -> None:
    from harness.seeds import eval_rollouts

    # One seed and name per (task, repeat), the same before and after (harness.seeds).
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
    from harness.eval_weights import rollout_versions
    from harness.run_records import RecordingFactory

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
    summary["causes"] = {c: sum(r["cause"] == c for r in factory.records)
                         for c in sorted({r["cause"] for r in factory.records})}
    summary["rollouts"] = rollout_versions(factory.records)  # the weights each one sampled
    (out / "eval_summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _rate(row: dict) -> float | None:
    return row["passed"] / row["scored"] if row.get("scored") else None


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def before_after_table(before: dict, after: dict, *, title: str = "Held-out pass rate"
                       ) -> tuple[Table, dict]:
    """Per-task and overall passes before and after, with the change in points."""
    table = Table(title=f"{title}: before -> after training")
    for column in ("task", "before", "after", "change"):
        table.add_column(column, justify="left" if column == "task" else "right")
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


def write_reward_curve(run_dir: Path, history: list[dict[str, float]], *, shuffled: bool,
                       force_builtin: bool = False) -> tuple[Path, Path]:
    """<run>/reward_curve.json and <run>/reward_curve.png; returns their paths."""
    curve = reward_curve(history, shuffled=shuffled)
    json_path, png_path = run_dir / "reward_curve.json", run_dir / "reward_curve.png"
    json_path.write_text(json.dumps(curve, indent=1))
    series = {"reward mean" + (" (shuffled control)" if shuffled else ""): curve["reward_mean"]}
    if "env_reward_mean" in curve:
        series["verifier reward mean"] = curve["env_reward_mean"]
    try:
        if force_builtin:
            raise ImportError("built-in plot asked for")
        _matplotlib_plot(png_path, curve["steps"], series)
    except ImportError:
        write_png_plot(png_path, curve["steps"], list(series.values()))
    return json_path, png_path


def _matplotlib_plot(path: Path, steps: list[int], series: dict[str, list]) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here, ever
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for name, values in series.items():
        ax.plot(steps, [math.nan if v is None else v for v in values], marker="o", label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


_COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44))


def write_png_plot(path: Path, xs: list[float], series: list[list[float | None]],
                   width: int = 640, height: int = 360) -> None:
    """A line plot as an RGB PNG with no dependency: axes, y gridlines at tenths of the range,
    one coloured line with square markers per series; None values break a line."""
    pixels = bytearray(b"\xff" * (width * height * 3))
    left, right, top, bottom = 40, width - 20, 20, height - 30
    values = [v for s in series for v in s if v is not None and math.isfinite(v)]
    lo, hi = min([0.0, *values]), max([1.0, *values])
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0, 1)
    x_span = (x_hi - x_lo) or 1

    def put(x: int, y: int, colour: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            pixels[i:i + 3] = bytes(colour)

    def line(x0: int, y0: int, x1: int, y1: int, colour: tuple[int, int, int]) -> None:
        n = max(abs(x1 - x0), abs(y1 - y0), 1)
        for k in range(n + 1):
            put(round(x0 + (x1 - x0) * k / n), round(y0 + (y1 - y0) * k / n), colour)

    def to_px(x: float, y: float) -> tuple[int, int]:
        return (round(left + (x - x_lo) / x_span * (right - left)),
                round(bottom - (y - lo) / (hi - lo) * (bottom - top)))

    for k in range(11):
        y = round(bottom - k / 10 * (bottom - top))
        line(left, y, right, y, (225, 225, 225))
    line(left, top, left, bottom, (0, 0, 0))
    line(left, bottom, right, bottom, (0, 0, 0))
    for s, colour in zip(series, _COLOURS * (len(series) // len(_COLOURS) + 1), strict=False):
        previous = None
        for x, v in zip(xs, s, strict=True):
            if v is None or not math.isfinite(v):
                previous = None
                continue
            px, py = to_px(x, v)
            for dx in range(-2, 3):
                for dy in range(-2, 3):
                    put(px + dx, py + dy, colour)
            if previous is not None:
                line(*previous, px, py, colour)
            previous = (px, py)
    raw = b"".join(b"\x00" + bytes(pixels[r * width * 3:(r + 1) * width * 3])
                   for r in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    path.write_bytes(b"\x89PNG\r\n\x1a\n"
                     + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
