# Run: .venv/bin/python -m pytest tests/test_bench_learning.py -x -q
"""bench/learning's arithmetic, on run folders written here (the bench's runs take hours): the
per-instruction changes, the two-way cluster bootstrap interval, the swap and blind summaries
read from recorded calls, every check of issue 32's bar failing when its condition fails, and
the table naming what it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.learning import run
from bench.learning.stats import (
    clustered_interval,
    control_summary,
    per_instruction_change,
    swap_summary,
    verdict,
)
from tests.helpers.bench_runs import INSTRUCTIONS
from tests.helpers.bench_runs import before_after as _before_after
from tests.helpers.bench_runs import record as _record


def test_changes_are_per_instruction_and_unscored_sides_are_left_out():
    data = _before_after({"a": (1, 5), "b": (4, 2)})
    data["per_task"]["c"] = {"before": {"passed": 0, "scored": 0}, "after": {"passed": 1,
                                                                          "scored": 8}}
    assert per_instruction_change(data) == {"a": 50.0, "b": -25.0}


def test_the_interval_holds_the_mean_widens_with_spread_and_needs_two_seeds():
    tight = [{i: 30.0 + d for i in INSTRUCTIONS} for d in (-1, 0, 1, 0)]
    loose = [{i: 30.0 + d for i in INSTRUCTIONS} for d in (-20, 0, 20, 0)]
    lo, hi = clustered_interval(tight)
    assert lo <= 30.0 <= hi and hi - lo < 3
    lo2, hi2 = clustered_interval(loose)
    assert hi2 - lo2 > 10 * (hi - lo)
    assert clustered_interval(tight) == clustered_interval(tight)  # seeded
    assert clustered_interval(tight[:1]) is None
    # Instruction spread widens it too, even with identical seeds.
    uneven = [{i: (60.0 if n % 2 else 0.0) for n, i in enumerate(INSTRUCTIONS)}] * 4
    lo3, hi3 = clustered_interval(uneven)
    assert lo3 < 30.0 < hi3 and hi3 - lo3 > 20


def test_the_swap_summary_reads_the_written_word_against_the_file_and_the_original():
    # lookup-...-table-swap: the file shows queue (the next word); the instance's own is table.
    records = [
        _record("lookup-key-answer-t0-table-swap", 1.0, "cat key.txt", "echo queue > answer.txt"),
        _record("lookup-key-answer-t0-table-swap", 0.0, "cat key.txt", "echo table > answer.txt"),
        _record("lookup-key-answer-t0-table-swap", 0.0, "cat key.txt", "echo queue > out.txt"),
        _record("lookup-key-answer-t0-table-swap", 1.0, "cat key.txt",
                "echo lock > /app/answer.txt", "echo queue > answer.txt"),  # the last one counts
    ]
    assert swap_summary(records) == {"answered": 3, "rollouts": 4, "follows": round(2 / 3, 4),
                                     "original": round(1 / 3, 4)}
    assert swap_summary([])["follows"] is None


def _seeds(rise: float, spread: float = 2.0) -> list[dict[str, float]]:
    return [{i: rise + d for i in INSTRUCTIONS} for d in (-spread, 0, spread, 0)]


def _control(*changes: float) -> dict:
    return control_summary([{i: c for i in INSTRUCTIONS} for c in changes])


GOOD = dict(controls={"shuffle": _control(9.0, -4.0, 1.0, -2.0, 3.0, -6.0, 0.0, 7.0), "lr0": _control(-2.0),
                      "flip": _control(-12.0)},
            swap={"follows": 0.9, "answered": 50}, blind_pass=0.1)
SHUFFLE = "shuffle's 95% interval over >= 8 seeds within +-5"


def test_the_bar_is_met_only_when_every_check_holds():
    assert verdict(_seeds(30.0), **GOOD)["meets_bar"]
    failing = {
        "seeds >= 4": dict(seeds=_seeds(30.0)[:3]),
        "mean rise >= 20": dict(seeds=_seeds(15.0)),
        "interval lower end >= 10": dict(seeds=_seeds(22.0, spread=40.0)),
        SHUFFLE: dict(controls={**GOOD["controls"], "shuffle": _control(-10.4, -3, -8, -1, -12, 2, -9, -4)}),
        "lr0 within +-5": dict(controls={**GOOD["controls"], "lr0": _control(6.0)}),
        "flip falls": dict(controls={**GOOD["controls"], "flip": _control(0.0)}),
        "swap follows >= 70%": dict(swap={"follows": 0.5}),
        "blind at chance (<= 1/8 + 5 points)": dict(blind_pass=0.4),
    }
    for check, change in failing.items():
        args = {"seeds": _seeds(30.0), **GOOD, **change}
        v = verdict(args.pop("seeds"), **args)
        assert not v["meets_bar"], check
        assert [k for k, ok in v["checks"].items() if not ok] == [check]


def test_the_shuffled_control_is_judged_on_its_interval_over_eight_seeds_never_on_one_draw():
    shuffle = GOOD["controls"]["shuffle"]
    assert shuffle["per_seed"] == [9.0, -4.0, 1.0, -2.0, 3.0, -6.0, 0.0, 7.0]
    assert shuffle["mean"] == 1.0
    lo, hi = shuffle["interval"]
    assert -5.0 <= lo < -1.0 and 3.0 < hi <= 5.0  # the seeds' spread is in it, inside +-5
    # A lucky draw, or four seeds (the old minimum), does not pass.
    for too_few in (_control(0.0), _control(1.0, -1.0, 0.5), _control(1.0, -1.0, 0.5, 0.0)):
        v = verdict(_seeds(30.0), **{**GOOD, "controls": {**GOOD["controls"],
                                                          "shuffle": too_few}})
        assert [k for k, ok in v["checks"].items() if not ok] == [SHUFFLE]
    # A mean inside +-5 whose interval is not: the eight seeds of 2026-12-06 (mean -4.8, SD 15),
    # and a wide spread around an exact 0. Neither shows the control stays within +-5.
    for lucky in (_control(10.4, 1.0, -3.1, -3.1, -27.1, -22.9, 16.7, -10.4),
                  _control(20.0, -20.0, 15.0, -15.0, 10.0, -10.0, 0.0, 0.0)):
        assert abs(lucky["mean"]) <= 5.0
        assert lucky["interval"][0] < -5.0 or lucky["interval"][1] > 5.0
        v = verdict(_seeds(30.0), **{**GOOD, "controls": {**GOOD["controls"], "shuffle": lucky}})
        assert [k for k, ok in v["checks"].items() if not ok] == [SHUFFLE]
    missing = verdict(_seeds(30.0), **{**GOOD, "controls": {"lr0": _control(0.0),
                                                            "flip": _control(-1.0)}})
    assert [k for k, ok in missing["checks"].items() if not ok] == [SHUFFLE]
    assert control_summary([])["mean"] is None


def test_report_reads_a_bench_folder_and_the_table_says_what_failed(tmp_path: Path):
    out = tmp_path / "learning"
    for s, rise in zip(range(4), (3, 4, 2, 3), strict=True):
        (out / f"seed-{s}").mkdir(parents=True)
        (out / f"seed-{s}" / "before_after.json").write_text(json.dumps(_before_after(
            {i: (1, 1 + rise) for i in INSTRUCTIONS})))
    for name, after in (("shuffle-0", 2), ("shuffle-1", 0),
                        *((f"shuffle-{s}", 1) for s in range(2, 8)), ("lr0-0", 1), ("flip-0", 0), ("lr0-1", 8), ("flip-1", 8)):
        (out / name).mkdir()  # lr0-1 and flip-1 are not control runs: the report skips them
        data = _before_after({i: (1, after) for i in INSTRUCTIONS})
        data["change_points"] = 100.0 * (after - 1) / 8  # the run's own whole-split change
        (out / name / "before_after.json").write_text(json.dumps(data))
    for s in range(4):
        rollouts = out / f"blind-{s}" / "rollouts"
        rollouts.mkdir(parents=True)
        (rollouts / "0.json").write_text(json.dumps(_record(
            "lookup-key-answer-t0-table-blind", 0.0, "cat key.txt", "echo x > answer.txt")))
        (out / f"blind-{s}" / "eval_summary.json").write_text("{}")  # finished
    result = run.report(out, [0, 1, 2, 3], ["shuffle", "lr0", "flip"], list(range(8)))
    v = result["verdict"]
    assert v["mean_rise"] == pytest.approx(37.5)
    assert {c: s["per_seed"] for c, s in result["controls"].items()} == {
        "shuffle": [12.5, -12.5, *[0.0] * 6], "lr0": [0.0], "flip": [-12.5]}
    assert result["controls"]["shuffle"]["mean"] == 0.0
    assert result["blind_pass_rate"] == 0.0 and result["swap"] is None
    assert [k for k, ok in v["checks"].items() if not ok] == ["swap follows >= 70%"]
    text = "\n".join(run.table_lines(result))
    assert "seeds' mean rise +37.5 points over 4" in text and "swap follows >= 70%: NO" in text
    assert "shuffle control: mean change +0.0 points over 8 seed(s) (+12.5, -12.5, +0.0, +0.0, " \
        "+0.0, +0.0, +0.0, +0.0)" in text
    assert "does not meet issue 32's bar" in text
    # Each seed's change (30.0) minus its own shuffled run's (+12.5, -12.5, 0, 0).
    assert result["over_shuffle"] == {"per_seed": {0: 17.5, 1: 42.5, 2: 30.0, 3: 30.0},
                                      "mean": 30.0}
    assert "rise over the same seed's shuffled control: mean +30.0 points (seed 0 +17.5, " \
        "seed 1 +42.5" in text
    assert json.loads((out / "summary.json").read_text())["controls"]["flip"]["mean"] == -12.5
    # One shuffled seed alone (the other seven not run) fails the shuffle check by name.
    one = run.report(out, [0, 1, 2, 3], ["shuffle", "lr0", "flip"], [0])
    assert not one["verdict"]["checks"][SHUFFLE]


def test_shuffle_runs_at_every_control_seed_and_lr0_and_flip_at_the_first():
    assert run.control_runs(["shuffle", "lr0", "flip"], [3, 5, 7, 9]) == [
        "shuffle-3", "shuffle-5", "shuffle-7", "shuffle-9", "lr0-3", "flip-3"]
    assert run.control_runs([], [0, 1]) == []


def test_the_commands_are_the_main_command_with_each_control_and_the_diagnostics(tmp_path):
    assert run.train_command("seed-2", 2, tmp_path, [])[-4:] == ["--seed", "2", "--output-dir",
                                                                 str(tmp_path / "seed-2")]
    assert run.train_command("lr0-0", 0, tmp_path, [])[-2:] == ["--learning-rate", "0"]
    assert run.train_command("flip-0", 0, tmp_path, ["--steps", "1"])[-3:] == [
        "--steps", "1", "--flip-rewards"]
    diag = run.diagnostic_command(1, "swap", tmp_path / "v", tmp_path)
    assert str(tmp_path / "seed-1" / "trainer" / "model") in diag
    assert str(tmp_path / "v" / "test") in diag
    assert diag[3:5] == ["--harness", "mini-swe-agent"]


def test_an_extra_learning_rate_sets_the_seeds_rate_and_never_replaces_lr0s_zero(tmp_path):
    # Run as harness.train parses it: argparse keeps a flag's last value, so the order decides.
    from harness.shared.run_config import build_parser, settings_from_args

    extra = ["--optimizer", "sgd", "--learning-rate", "0.25"]
    rate = lambda name: settings_from_args(  # noqa: E731
        build_parser("harness.train", ""), run.train_command(name, 0, tmp_path, extra)[3:]
    ).learning_rate
    assert rate("lr0-0") == 0.0
    assert rate("seed-0") == rate("shuffle-0") == rate("flip-0") == 0.25


@pytest.mark.parametrize("flag", ["--shuffle-rewards", "--flip-rewards", "--seed=3",
                                  "--output-dir", "--harness", "--see", "--output", "--flip"])
def test_an_extra_flag_the_bench_sets_per_run_is_refused_by_name(flag, tmp_path):
    with pytest.raises(SystemExit, match=flag.split("=")[0] + " after -- would override"):
        run.main(["--report-only", "--out", str(tmp_path), "--", "--steps", "2", flag])


def test_no_harness_train_flag_is_refused_as_a_prefix_of_one_the_bench_owns():
    # The prefix rule above must not refuse a flag harness.train has in its own right.
    from harness.shared.run_config import build_parser

    parser = build_parser("harness.train", "")
    flags = [f for action in parser._actions for f in action.option_strings
             if f.startswith("--") and f not in run.BENCH_OWNED_FLAGS]
    assert "--learning-rate" in flags and "--steps" in flags
    run.check_extra(flags)  # raises on any of them
    assert parser.parse_args(["--see", "3"]).seed == 3  # why the prefix rule exists


def test_another_agent_runs_the_same_commands_with_only_its_harness_changed(tmp_path):
    for name in ("seed-0", "flip-0"):
        default = run.train_command(name, 0, tmp_path, [])
        claude = run.train_command(name, 0, tmp_path, [], "claude-code")
        assert [i for i, (a, b) in enumerate(zip(default, claude, strict=True)) if a != b] == [4]
        assert claude[3:5] == ["--harness", "claude-code"]
    diag = run.diagnostic_command(0, "blind", tmp_path / "v", tmp_path, "opencode")
    assert diag[3:5] == ["--harness", "opencode"]


def test_the_reward_curves_are_each_runs_and_the_means_of_seeds_and_of_controls(tmp_path):
    for name, curve in (("seed-0", [0.1, 0.3, 0.5]), ("seed-1", [0.2, 0.3, 0.45]),
                        ("shuffle-0", [0.1, 0.1, 0.12]), ("flip-0", [0.1, 0.08, 0.06])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "reward_curve.json").write_text(json.dumps(
            {"steps": [1, 2, 3], "reward_mean": curve}))
    png = run.write_reward_curves(tmp_path, ["seed-0", "seed-1", "shuffle-0", "flip-0", "lr0-0"])
    curves = json.loads((tmp_path / "reward_curves.json").read_text())
    assert curves["runs"]["seed-1"] == [0.2, 0.3, 0.45] and "lr0-0" not in curves["runs"]
    assert curves["seeds_mean"] == pytest.approx([0.15, 0.3, 0.475])
    assert curves["controls_mean"] == pytest.approx([0.1, 0.09, 0.09])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
