"""Does the loop learn? Seeds of the main command, three controls, two diagnostics, one table.

    .venv/bin/python bench/learning/run.py [--seeds 0 1 2 3] [--controls shuffle lr0 flip]
                                           [--control-seeds 0 1 ... 7] [--no-diagnostics]
                                           [--out runs/learning] [--ledger DIR]
                                           [--report-only]
                                           [--harness mini-swe-agent] [--jobs 1]
                                           [-- EXTRA harness.train FLAGS]

Each seed runs the README's main command, `python -m harness.train --harness mini-swe-agent
--seed S` (its defaults: the lookup warm start, lookup:train, lookup:test evaluated before and
after, the verifier's reward alone) into OUT/seed-S; `--harness` runs the same command with
another agent, from that agent's own committed warm start. Three controls: `shuffle` (rewards
permuted within each group) runs at every `--control-seeds` seed and must stay within +-5
points: one shuffled run is a draw from the -27 to +17 points that 12 steps of training on
uninformative rewards move this policy (docs/learning.md), so it is judged over at least 8
seeds, and passes only when the 95% interval of their mean lies inside +-5
(stats.CONTROL_MIN_SEEDS says why); `lr0` (learning rate 0: every step runs and pushes, the
weights never move, so its change is evaluation noise) must stay within +-5 points and `flip`
(each reward r trained as 1 - r) must fall, each at the first control seed. Two diagnostics run
`harness.eval` on each seed's trained model (OUT/seed-S/trainer/model): the test split's `swap`
variant (the file holds another word than in training's instance: the written word must follow
the file in >= 70% of answers) and its `blind` variant (the file holds no word: the pass rate
must fall to chance, 1/8).

The table: per run, the test pass rate before and after and the change; the seeds' mean rise
with a 95% interval from a two-way cluster bootstrap over seeds and test instructions
(bench/learning/stats.py); the controls; swap and blind; issue 32's bar. The test split is
read here and by the main command's final table only: nothing is tuned on it. It also writes
OUT/summary.json and OUT/reward_curves.{json,png}. Each run that finishes is also recorded, small,
in a ledger meant to be committed (`--ledger`, default bench/learning/results/<OUT's name>:
bench/learning/ledger.py), so a bench can be finished over sittings on different machines.
`--report-only` re-reads OUT and the ledger without running anything. A rerun of the same bench
keeps each run that already finished, in OUT or the ledger, with the settings its command gives
now, and starts the rest (a run of other settings stops it: bench/learning/schedule.py); a
diagnostic needs its seed's model on this machine, so a seed kept only in the ledger is trained
again for a diagnostic it lacks. Runs go one after another unless `--jobs N`, which only
synchronous runs (`-- --max-staleness 0`) may use: the async default's numbers follow the
machine's load, so concurrent runs would measure each other's. A run of 4 seeds, 3 controls at
one seed and 8 diagnostics took 70 min here (2026-12-04, mini-swe-agent, the test suite running
at `nice 19` beside it); the default's seven more shuffled seeds add about 60 min.

Every figure it has printed so far ran the main command's default, asynchronous training, where
which weights sampled a rollout follows the machine's load (the same shuffled seed moved up to
20 points between sittings). `-- --max-staleness 0` trains synchronously: each run is then a
function of its seed and a rerun samples the same tokens (README: Reproducible runs).

Flags after `--` go to every training run (not the diagnostics' harness.eval), before the
control's own, so a control keeps its setting (`-- --learning-rate 0.25` leaves lr0 at 0); the
flags the bench sets per run (--harness, --seed, --output-dir, --shuffle-rewards,
--flip-rewards) are refused there by name.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script: the repo's rooms

from bench.learning import ledger as ledgers  # noqa: E402
from bench.learning.schedule import (  # noqa: E402
    Job,
    check_parallel,
    diagnostic_is_kept,
    run_jobs,
    training_is_kept,
)
from bench.learning.stats import (  # noqa: E402
    CONTROL_MIN_SEEDS,
    CONTROLS,
    control_summary,
    pass_rate,
    per_instruction_change,
    read_records,
    swap_summary,
    verdict,
)
from harness.shared.run_config import HARNESSES  # noqa: E402

DEFAULT_HARNESS = "mini-swe-agent"
DIAGNOSTICS = ("swap", "blind")


# Flags the bench sets per run: one of them after `--` would run every seed as that control
# (--shuffle-rewards), every run on one seed or into one folder, or mix agents, with nothing to
# show it in the table.
BENCH_OWNED_FLAGS = ("--harness", "--seed", "--output-dir", "--shuffle-rewards", "--flip-rewards")


def check_extra(extra: list[str]) -> None:
    """Refuse, by name, an extra flag that would override what the bench sets per run, typed
    whole or as the prefix argparse would take for it (`--see 3` is `--seed 3` to harness.train;
    no harness.train flag is itself a prefix of these, which the tests check)."""
    for flag in extra:
        name = flag.split("=", 1)[0]
        owned = [f for f in BENCH_OWNED_FLAGS if len(name) > 2 and f.startswith(name)]
        if name.startswith("--") and owned:
            raise SystemExit(f"bench/learning/run.py: {name} after -- would override what the "
                             f"bench sets per run ({owned[0]}); use the bench's own --harness, "
                             "--seeds, --out and --controls")


def train_command(name: str, seed: int, out: Path, extra: list[str],
                  harness: str = DEFAULT_HARNESS) -> list[str]:
    # The control's flags come after the extra ones: argparse keeps a flag's last value, so
    # `-- --learning-rate 0.25` sets the seeds' rate and never replaces lr0's 0.
    control = CONTROLS.get(name.split("-")[0], [])
    return [sys.executable, "-m", "harness.train", "--harness", harness, "--seed", str(seed),
            "--output-dir", str(out / name), *extra, *control]


def diagnostic_command(seed: int, variant: str, tasks: Path, out: Path,
                       harness: str = DEFAULT_HARNESS) -> list[str]:
    """harness.eval of seed S's trained model on a variant of the test split."""
    return [sys.executable, "-m", "harness.eval", "--harness", harness, "--seed", str(seed),
            "--model", str(out / f"seed-{seed}" / "trainer" / "model"),
            "--tasks", str(tasks / "test"), "--rollouts-per-task", "1",
            "--max-agent-steps", "2", "--output-dir", str(out / f"{variant}-{seed}")]


def control_runs(controls: list[str], control_seeds: list[int]) -> list[str]:
    """The control runs' names: `shuffle` at every control seed (its check needs the mean of
    several), `lr0` and `flip` at the first one (one seed answers each: stats.CONTROL_MIN_SEEDS)."""
    return [f"{c}-{s}" for c in controls
            for s in (control_seeds if CONTROL_MIN_SEEDS[c] > 1 else control_seeds[:1])]


def read_result(run_dir: Path, ledger: Path | None = None) -> dict | None:
    """A run's before/after figures and per-instruction changes, from its folder or else its
    ledger entry, or None (not run, or failed)."""
    path = run_dir / "before_after.json"
    entry = None if path.exists() else ledgers.read(ledger, run_dir.name)
    if entry is None and not path.exists():
        return None
    data = entry["before_after"] if entry else json.loads(path.read_text())
    return {"from_ledger": entry is not None,
            **{k: data.get(k) for k in ("before_pass_rate", "after_pass_rate",
                                        "change_points", "seed")},
            "per_instruction": per_instruction_change(data),
            "step_rates": data.get("step_rates")}


def reward_curves(out: Path, names: list[str], ledger: Path | None = None) -> dict:
    """Every run's training reward per step (reward_curve.json, or its ledger entry's), and the
    mean over seeds and over controls at each step the runs share."""
    curves: dict = {"runs": {}}
    for name in names:
        path = out / name / "reward_curve.json"
        entry = None if path.exists() else ledgers.read(ledger, name)
        if path.exists():
            curves["runs"][name] = json.loads(path.read_text())["reward_mean"]
        elif entry and entry.get("reward_mean") is not None:
            curves["runs"][name] = entry["reward_mean"]
    for kind, prefixes in (("seed", ("seed-",)), ("control", tuple(f"{c}-" for c in CONTROLS))):
        runs = [r for n, r in curves["runs"].items() if n.startswith(prefixes)]
        steps = min((len(r) for r in runs), default=0)
        curves[f"{kind}s_mean"] = [
            None if any(r[i] is None for r in runs) else sum(r[i] for r in runs) / len(runs)
            for i in range(steps)]
    return curves


def write_reward_curves(out: Path, names: list[str], ledger: Path | None = None) -> Path:
    """OUT/reward_curves.json and OUT/reward_curves.png (seeds' mean, then controls' mean)."""
    from harness.run.plots import line_figure, save_png

    curves = reward_curves(out, names, ledger)
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


def over_shuffle(runs: dict, seeds: list[int]) -> dict | None:
    """Each seed's rise minus its shuffled control's change at the same seed (the same tasks in
    the same order, the same rollouts at step 1): the part of the rise the rewards carried."""
    pairs = {s: runs[f"seed-{s}"]["change_points"] - runs[f"shuffle-{s}"]["change_points"]
             for s in seeds if (runs.get(f"seed-{s}") or {}).get("change_points") is not None
             and (runs.get(f"shuffle-{s}") or {}).get("change_points") is not None}
    return {"per_seed": pairs, "mean": sum(pairs.values()) / len(pairs)} if pairs else None


def diagnostic_records(out: Path, name: str, ledger: Path | None) -> tuple[list[dict], dict]:
    """A finished diagnostic's rollouts from its folder, or else from its ledger entry (with the
    entry's provenance), or none. A folder without eval_summary.json is an evaluation still
    running (or killed): its first rollouts are not the diagnostic's result, so it is not read."""
    if (out / name).exists():
        return (read_records(out / name) if (out / name / "eval_summary.json").exists()
                else []), {}
    entry = ledgers.read(ledger, name)
    return (entry["records"], {name: entry["provenance"]}) if entry else ([], {})


def report(out: Path, seeds: list[int], controls: list[str], control_seeds: list[int],
           ledger: Path | None = None) -> dict:
    """Record what finished in OUT in the ledger, then read OUT and, for what OUT lacks, the
    ledger: every run's result, the diagnostics, the verdict (also OUT/summary.json)."""
    names = [f"seed-{s}" for s in seeds] + control_runs(controls, control_seeds)
    diagnostics = [f"{v}-{s}" for v in DIAGNOSTICS for s in seeds]
    ledgers.record_finished(out, ledger, names + diagnostics)
    runs = {name: read_result(out / name, ledger) for name in names}
    from_ledger = {n: ledgers.read(ledger, n)["provenance"] for n, r in runs.items()
                   if r and r["from_ledger"]}
    records = {}
    for name in diagnostics:
        records[name], provenance = diagnostic_records(out, name, ledger)
        from_ledger.update(provenance)
    unfinished = [n for n in names + diagnostics if (out / n).exists() and not any(
        (out / n / done).exists() for done in ("before_after.json", "eval_summary.json"))]
    swap_records = [r for s in seeds for r in records[f"swap-{s}"]]
    blind_records = [r for s in seeds for r in records[f"blind-{s}"]]
    seed_changes = [r["per_instruction"] for n, r in runs.items()
                    if n.startswith("seed-") and r and r["per_instruction"]]
    control_changes = {c: control_summary([runs[n]["per_instruction"] for n in names
                                           if n.split("-")[0] == c and runs[n]
                                           and runs[n]["per_instruction"]])
                       for c in controls}
    swap = swap_summary(swap_records) if swap_records else None
    blind = pass_rate(blind_records)
    result = {"runs": runs, "controls": control_changes, "swap": swap, "blind_pass_rate": blind,
              "over_shuffle": over_shuffle(runs, seeds), "from_ledger": from_ledger,
              "unfinished": unfinished,
              "verdict": verdict(seed_changes, control_changes, swap, blind)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    return result


def table_lines(result: dict) -> list[str]:
    pct = lambda x: "  -  " if x is None else f"{x:5.0%}"  # noqa: E731
    lines = [f"{'run':10s} {'before':>7s} {'after':>7s} {'change':>9s}  per-step after "
             "(looked / used the word / passed)"]
    for name, r in result["runs"].items():
        if r is None:
            lines.append(f"{name:10s} (not in this folder or the ledger: not run, or it failed)")
            continue
        change = "-" if r["change_points"] is None else f"{r['change_points']:+.1f} pt"
        steps = ((r.get("step_rates") or {}).get("after") or {})
        lines.append(f"{name:10s} {pct(r['before_pass_rate']):>7s} "
                     f"{pct(r['after_pass_rate']):>7s} {change:>9s}  "
                     + " / ".join(pct(steps.get(k)) for k in ("looked", "used_observation",
                                                              "passed")))
    v = result["verdict"]
    if v["mean_rise"] is not None:
        ci = v["interval"]
        lines.append(f"seeds' mean rise {v['mean_rise']:+.1f} points over {len(v['per_seed'])}"
                     + (f", 95% interval [{ci[0]:+.1f}, {ci[1]:+.1f}] (two-way cluster "
                        "bootstrap: seeds x test instructions)" if ci else ""))
    for name, c in result["controls"].items():
        if c["mean"] is None:
            continue
        ci = c["interval"]
        lines.append(f"{name} control: mean change {c['mean']:+.1f} points over "
                     f"{len(c['per_seed'])} seed(s) ("
                     + ", ".join(f"{m:+.1f}" for m in c["per_seed"]) + ")"
                     + (f", 95% interval [{ci[0]:+.1f}, {ci[1]:+.1f}]" if ci else ""))
    paired = result.get("over_shuffle")
    if paired:
        lines.append(f"rise over the same seed's shuffled control: mean {paired['mean']:+.1f} "
                     "points (" + ", ".join(f"seed {s} {d:+.1f}" for s, d in
                                            paired["per_seed"].items()) + ")")
    swap, blind = result["swap"], result["blind_pass_rate"]
    if swap:
        lines.append(f"swap test: {swap['answered']} of {swap['rollouts']} rollouts wrote a "
                     f"word; it was the file's in {pct(swap['follows'])}, the training "
                     f"instance's in {pct(swap['original'])}")
    if blind is not None:
        lines.append(f"blind test: pass rate {pct(blind)} with no word in the file (chance 13%)")
    if result.get("unfinished"):
        lines.append("not read, still running or stopped before its end: "
                     + ", ".join(result["unfinished"]))
    if result.get("from_ledger"):
        machines = sorted({f"{p['cpu']} ({p['cores']} cores)"
                           for p in result["from_ledger"].values()})
        lines.append(f"read from the ledger, not this folder: {', '.join(result['from_ledger'])}"
                     f" (trained on: {'; '.join(machines)})")
    lines.append("bar: " + "; ".join(f"{k}: {'yes' if ok else 'NO'}"
                                     for k, ok in v["checks"].items()))
    lines.append(f"{'MEETS' if v['meets_bar'] else 'does not meet'} issue 32's bar")
    return lines


def training_jobs(args: argparse.Namespace, extra: list[str]) -> list[Job]:
    names = [f"seed-{s}" for s in args.seeds] + control_runs(args.controls, args.control_seeds)
    return [Job(n, train_command(n, int(n.rsplit("-", 1)[1]), args.out, extra, args.harness),
                args.out / n) for n in names]


def check_finished_rows(args: argparse.Namespace, extra: list[str]) -> None:
    """`--report-only`: every finished row the table would read, in OUT or the ledger, is of
    this command's settings (bench/learning/schedule.py's keep rule), or it stops naming what
    differs: a row of another setting would otherwise be averaged in with nothing to show it.
    A run still in progress (a folder without before_after.json) is only shown as missing."""
    for job in training_jobs(args, extra):
        entry = ledgers.read(args.ledger, job.name)
        if (job.folder / "before_after.json").exists() or (entry and not job.folder.exists()):
            training_is_kept(job, entry)


def run_bench(args: argparse.Namespace, extra: list[str]) -> None:
    """Train what OUT and the ledger lack, then evaluate the diagnostics they lack
    (bench/learning/schedule.py: what is kept, what stops the bench, what may run at once). A
    diagnostic to run needs its seed's model on this machine: a seed kept only in the ledger is
    trained again for it, and its other diagnostic with it."""
    ledger = args.ledger
    trainings = training_jobs(args, extra)
    to_train = [j for j in trainings if not training_is_kept(j, ledgers.read(ledger, j.name))]
    with tempfile.TemporaryDirectory(prefix="lookup-variants-") as scratch:
        diagnostics = [] if args.no_diagnostics else [
            Job(f"{v}-{s}", diagnostic_command(s, v, Path(scratch) / v, args.out, args.harness),
                args.out / f"{v}-{s}") for v in DIAGNOSTICS for s in args.seeds]
        seed_of = lambda job: f"seed-{job.name.rsplit('-', 1)[1]}"  # noqa: E731
        retrained = {j.name for j in to_train}
        missing = [j for j in diagnostics if not j.folder.exists()
                   and ledgers.read(ledger, j.name) is None]
        for job in missing:
            model = args.out / seed_of(job) / "trainer" / "model"
            if seed_of(job) not in retrained and not model.exists():
                print(f"{seed_of(job)}: kept in the ledger, but {job.name} needs its model, "
                      "which is not on this machine: trained again")
                retrained.add(seed_of(job))
                to_train += [j for j in trainings if j.name == seed_of(job)]
        to_diagnose = [j for j in diagnostics if not diagnostic_is_kept(
            j, model_retrained=seed_of(j) in retrained, entry=ledgers.read(ledger, j.name))]
        check_parallel(to_train, args.jobs)
        kept = [j.name for j in trainings + diagnostics if j not in to_train + to_diagnose]
        if kept:
            print(f"kept, already finished in {args.out} or its ledger {ledger} with these "
                  f"settings: {', '.join(kept)}")
        record = lambda job: ledgers.record_finished(args.out, ledger, [job.name])  # noqa: E731
        run_jobs(to_train, args.jobs, on_success=record)
        if to_diagnose:
            from harness.tasks.lookup import generate

            for variant in DIAGNOSTICS:
                generate(Path(scratch) / variant, variant=variant)
            run_jobs(to_diagnose, args.jobs, on_success=record)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    parser.add_argument("--controls", nargs="*", choices=sorted(CONTROLS),
                        default=["shuffle", "lr0", "flip"])
    parser.add_argument("--control-seeds", nargs="+", type=int,
                        default=list(range(CONTROL_MIN_SEEDS["shuffle"])),
                        help="seeds of the shuffled control; lr0 and flip run at the first "
                             "(default: %(default)s)")
    parser.add_argument("--no-diagnostics", action="store_true",
                        help="skip the swap and blind evaluations of the trained models")
    parser.add_argument("--out", type=Path, default=Path("runs/learning"))
    parser.add_argument("--ledger", type=Path, default=None,
                        help="where each finished run is also recorded, small, to be committed, "
                             "so a later sitting on any machine keeps it (default: "
                             "bench/learning/results/<OUT's name>; bench/learning/ledger.py)")
    parser.add_argument("--report-only", action="store_true",
                        help="only read OUT and the ledger (and record OUT's finished runs in "
                             "the ledger); give the same flags after -- as the bench's runs had: "
                             "a row of other settings stops it")
    parser.add_argument("--harness", default=DEFAULT_HARNESS,
                        choices=HARNESSES,
                        help="the agent every run and diagnostic uses (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at once, trainings then evaluations; above 1 only with "
                             "`-- --max-staleness 0` (default: %(default)s)")
    args = parser.parse_args(argv)
    check_extra(extra)
    args.ledger = args.ledger or ledgers.default_ledger(args.out)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more")
    if args.report_only:
        check_finished_rows(args, extra)
    else:
        run_bench(args, extra)
    result = report(args.out, args.seeds, args.controls, args.control_seeds, args.ledger)
    print("\n".join(table_lines(result)))
    names = [*result["runs"]]
    print(f"reward curves: {write_reward_curves(args.out, names, args.ledger)} "
          "(data: reward_curves.json)")
    return 0 if result["verdict"]["meets_bar"] else 1


if __name__ == "__main__":
    sys.exit(main())
