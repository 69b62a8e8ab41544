"""Does the loop learn? Seeds of the main command and their shuffled-reward controls, one table.

    .venv/bin/python bench/learning/run.py [--seeds 0 1 2 3] [--control-seeds 0 1]
                                           [--out runs/learning] [--report-only]
                                           [-- EXTRA harness.train FLAGS]

Each seed runs the README's main command, `python -m harness.train --harness mini-swe-agent
--seed S` (its defaults: the warm-started tiny model, family:train, family:heldout evaluated
before and after, the verifier's reward alone) into OUT/seed-S, and the same with
`--shuffle-rewards` into OUT/control-S (the falsification check: rewards permuted within each
group no longer follow actions, so a real rise there means a bug). Every run writes
before_after.json and reward_curve.{json,png} (harness/learning.py); this script only reads them
and prints the held-out pass rate before and after, per run, against issue 18's bar: a rise of
>= 20 points in at least 3 of 4 seeds, <= 5 points in every control. It also writes
OUT/reward_curves.json (every run's training reward per step) and OUT/reward_curves.png (the
seeds' mean in blue, the controls' mean in orange; y from 0 to 1, gridlines every 0.1).
`--control-seeds` picks which seeds get a control (default: all of --seeds). `--report-only`
re-reads OUT without running anything. Runs go one after another: this machine has 2 cores, and
concurrent runs would measure each other's load.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo's rooms

RISE_POINTS = 20.0  # issue 18: the held-out pass rate rises by >= 20 points ...
RISE_SEEDS = 3  # ... in at least 3 of 4 seeds
CONTROL_MAX_POINTS = 5.0  # ... and the shuffled control by no more than 5 in any

BASE_FLAGS = ["--harness", "mini-swe-agent"]


def run_name(seed: int, control: bool) -> str:
    return f"{'control' if control else 'seed'}-{seed}"


def train_command(seed: int, control: bool, out: Path, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "harness.train", *BASE_FLAGS, "--seed", str(seed),
           "--output-dir", str(out / run_name(seed, control))]
    return cmd + (["--shuffle-rewards"] if control else []) + extra


def read_result(run_dir: Path) -> dict | None:
    """A run's before/after figures, or None when it has none (not run, or it failed)."""
    path = run_dir / "before_after.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return {k: data.get(k) for k in ("before_pass_rate", "after_pass_rate", "change_points",
                                     "shuffled_rewards", "seed")}


def reward_curves(out: Path, names: list[str]) -> dict:
    """Every run's training reward per step (reward_curve.json), and the mean over seeds and
    over controls at each step the runs share."""
    curves: dict = {"runs": {}}
    for name in names:
        path = out / name / "reward_curve.json"
        if path.exists():
            curves["runs"][name] = json.loads(path.read_text())["reward_mean"]
    for kind in ("seed", "control"):
        runs = [r for n, r in curves["runs"].items() if n.startswith(kind + "-")]
        steps = min((len(r) for r in runs), default=0)
        curves[f"{kind}s_mean"] = [
            None if any(r[i] is None for r in runs) else sum(r[i] for r in runs) / len(runs)
            for i in range(steps)]
    return curves


def write_reward_curves(out: Path, names: list[str]) -> Path:
    """OUT/reward_curves.json and OUT/reward_curves.png (seeds' mean, then controls' mean)."""
    from harness.plots import line_figure, save_png

    curves = reward_curves(out, names)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward_curves.json").write_text(json.dumps(curves, indent=1))
    steps = max(len(curves["seeds_mean"]), len(curves["controls_mean"]))
    pad = lambda xs: xs + [None] * (steps - len(xs))  # noqa: E731
    series = {"seeds' mean": pad(curves["seeds_mean"]),
              "controls' mean": pad(curves["controls_mean"])}
    return save_png(line_figure(list(range(1, steps + 1)), series, xlabel="training step",
                                ylabel="mean reward of the step's rollouts",
                                title="Training reward per step, mean over runs"),
                    out / "reward_curves.png")


def verdict(results: dict[str, dict | None]) -> dict:
    """Issue 18's bar over the runs found: seeds that rose enough, controls that stayed flat."""
    seeds = {k: v for k, v in results.items() if k.startswith("seed-")}
    controls = {k: v for k, v in results.items() if k.startswith("control-")}
    risen = [k for k, v in seeds.items() if v and v["change_points"] is not None
             and v["change_points"] >= RISE_POINTS]
    flat = [k for k, v in controls.items() if v and v["change_points"] is not None
            and v["change_points"] <= CONTROL_MAX_POINTS]
    missing = sorted(k for k, v in results.items() if v is None or v["change_points"] is None)
    return {"seeds_risen": len(risen), "seeds": len(seeds), "controls_flat": len(flat),
            "controls": len(controls), "missing": missing,
            "meets_bar": not missing and len(seeds) >= 4 and len(risen) >= RISE_SEEDS
            and len(flat) == len(controls) and len(controls) >= 1}


def table_lines(results: dict[str, dict | None]) -> list[str]:
    pct = lambda x: "  -  " if x is None else f"{x:5.0%}"  # noqa: E731
    lines = [f"{'run':12s} {'before':>7s} {'after':>7s} {'change':>9s}"]
    for name, r in results.items():
        if r is None:
            lines.append(f"{name:12s} {'(no before_after.json: not run, or the run failed)'}")
            continue
        change = "-" if r["change_points"] is None else f"{r['change_points']:+.1f} pt"
        lines.append(f"{name:12s} {pct(r['before_pass_rate']):>7s} {pct(r['after_pass_rate']):>7s}"
                     f" {change:>9s}")
    means = []
    for kind in ("seed", "control"):
        changes = [r["change_points"] for k, r in results.items()
                   if k.startswith(kind + "-") and r and r["change_points"] is not None]
        if changes:
            means.append(f"{kind}s {sum(changes) / len(changes):+.1f} pt over {len(changes)}")
    if means:
        lines.append("mean change: " + ", ".join(means))
    v = verdict(results)
    lines.append(f"seeds rising >= {RISE_POINTS:.0f} points: {v['seeds_risen']}/{v['seeds']} "
                 f"(need {RISE_SEEDS} of 4); controls within {CONTROL_MAX_POINTS:.0f} points: "
                 f"{v['controls_flat']}/{v['controls']}; "
                 f"{'MEETS' if v['meets_bar'] else 'does not meet'} issue 18's bar")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--control-seeds", nargs="*", type=int, default=None,
                        help="seeds that also get a shuffled control (default: all of --seeds)")
    parser.add_argument("--no-control", action="store_true", help="skip the shuffled controls")
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--report-only", action="store_true", help="only read OUT")
    args = parser.parse_args(argv)
    controls = [] if args.no_control else (
        args.seeds if args.control_seeds is None else args.control_seeds)
    runs = [(s, False) for s in args.seeds] + [(s, True) for s in controls]
    for seed, control in runs:
        if args.report_only:
            break
        cmd = train_command(seed, control, args.out, extra)
        print("$", " ".join(cmd), flush=True)
        code = subprocess.run(cmd, check=False).returncode
        if code != 0:
            print(f"{run_name(seed, control)} exited {code}; its row will be missing", flush=True)
    results = {run_name(s, c): read_result(args.out / run_name(s, c)) for s, c in runs}
    print("\n".join(table_lines(results)))
    print(f"reward curves: {write_reward_curves(args.out, list(results))} (data: reward_curves.json)")
    return 0 if verdict(results)["meets_bar"] else 1


if __name__ == "__main__":
    sys.exit(main())
