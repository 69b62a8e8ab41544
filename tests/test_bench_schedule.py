# Run: .venv/bin/python -m pytest tests/test_bench_schedule.py -x -q
"""bench/learning/schedule.py: a rerun of the bench keeps only finished runs of the settings its
command gives now, stops before starting anything on a folder of other settings or an unfinished
one, refuses concurrent asynchronous trainings, and runs `--jobs` commands at once."""

from __future__ import annotations

import sys

import pytest

from bench.learning import run, schedule
from bench.learning.schedule import Job, PlanError
from tests.helpers.bench_runs import SGD
from tests.helpers.bench_runs import finished as _finished


def test_a_finished_run_of_the_same_settings_is_kept_wherever_it_was_trained(tmp_path):
    job = Job("seed-0", run.train_command("seed-0", 0, tmp_path, SGD), tmp_path / "seed-0")
    assert not schedule.training_is_kept(job)  # no folder: train it
    _finished(job.folder, job.command, output_dir="runs/elsewhere/real-0")
    assert schedule.training_is_kept(job)


@pytest.mark.parametrize(("changed", "named"), [
    ({"learning_rate": 0.5}, "learning_rate: 0.5 there, 0.25 now"),
    ({"optimizer": "adamw"}, "optimizer: 'adamw' there, 'sgd' now"),
    ({"shuffle_rewards": True}, "shuffle_rewards: True there, False now"),
    ({"a_setting_from_other_code": 1}, "a_setting_from_other_code: 1 there, '(absent)' now"),
])
def test_a_run_of_other_settings_stops_the_bench_naming_what_differs(tmp_path, changed, named):
    job = Job("seed-0", run.train_command("seed-0", 0, tmp_path, SGD), tmp_path / "seed-0")
    _finished(job.folder, job.command, **changed)
    with pytest.raises(PlanError, match="trained with other settings") as caught:
        schedule.training_is_kept(job)
    assert named in str(caught.value)


def test_an_unfinished_or_unrecorded_run_stops_the_bench(tmp_path):
    job = Job("seed-0", run.train_command("seed-0", 0, tmp_path, SGD), tmp_path / "seed-0")
    _finished(job.folder, job.command)
    (job.folder / "before_after.json").unlink()
    with pytest.raises(PlanError, match="unfinished run"):
        schedule.training_is_kept(job)
    (job.folder / "before_after.json").write_text("{}")
    (job.folder / "settings.json").unlink()
    with pytest.raises(PlanError, match="no settings.json"):
        schedule.training_is_kept(job)


def test_a_diagnostic_is_kept_only_for_a_model_the_bench_keeps(tmp_path):
    job = Job("swap-0", run.diagnostic_command(0, "swap", tmp_path / "v", tmp_path),
              tmp_path / "swap-0")
    assert not schedule.diagnostic_is_kept(job, model_retrained=True)  # nothing there yet
    job.folder.mkdir()
    with pytest.raises(PlanError, match="unfinished evaluation"):
        schedule.diagnostic_is_kept(job, model_retrained=False)
    (job.folder / "eval_summary.json").write_text("{}")
    assert schedule.diagnostic_is_kept(job, model_retrained=False)
    with pytest.raises(PlanError, match="about to train again"):
        schedule.diagnostic_is_kept(job, model_retrained=True)


def test_concurrent_trainings_must_be_synchronous(tmp_path):
    sync = [Job(n, run.train_command(n, 0, tmp_path, SGD), tmp_path / n)
            for n in ("seed-0", "shuffle-0")]
    # lr0's own flags come last and leave --max-staleness 0 in place.
    sync.append(Job("lr0-0", run.train_command("lr0-0", 0, tmp_path, SGD), tmp_path / "lr0-0"))
    schedule.check_parallel(sync, 3)
    asynchronous = Job("seed-1", run.train_command("seed-1", 1, tmp_path, []), tmp_path / "x")
    schedule.check_parallel([asynchronous], 1)  # one at a time: allowed
    with pytest.raises(PlanError, match=r"seed-1 would train asynchronously.*max-staleness 0"):
        schedule.check_parallel([*sync, asynchronous], 2)


def test_jobs_run_at_once_each_into_its_own_log_and_report_their_exit_codes(tmp_path):
    # Each job writes its mark, then waits for the other's: one at a time, the first would
    # wait out its 30 s and exit 3.
    script = ("import pathlib, sys, time\n"
              "me, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])\n"
              "me.touch(); print('started', me.name)\n"
              "for _ in range(300):\n"
              "    if other.exists(): sys.exit(0)\n"
              "    time.sleep(0.1)\n"
              "sys.exit(3)\n")
    a, b = tmp_path / "a.mark", tmp_path / "b.mark"
    jobs = [Job("a", [sys.executable, "-c", script, str(a), str(b)], tmp_path / "out" / "a"),
            Job("b", [sys.executable, "-c", script, str(b), str(a)], tmp_path / "out" / "b"),
            Job("c", [sys.executable, "-c", "import sys; sys.exit(5)"], tmp_path / "out" / "c")]
    assert schedule.run_jobs(jobs, parallel=2) == {"a": 0, "b": 0, "c": 5}
    assert (tmp_path / "out" / "a.log").read_text() == "started a.mark\n"


def test_a_rerun_of_the_bench_starts_only_what_is_missing(tmp_path, monkeypatch, capsys):
    started: list[str] = []
    monkeypatch.setattr(run, "run_jobs", lambda jobs, parallel, on_success=None: started.extend(
        j.name for j in jobs))
    _finished(tmp_path / "seed-0", run.train_command("seed-0", 0, tmp_path, SGD))
    book = ["--ledger", str(tmp_path / "ledger")]
    run.main(["--seeds", "0", "1", "--controls", "lr0", "--control-seeds", "0",
              "--no-diagnostics", "--jobs", "2", "--out", str(tmp_path), *book, "--", *SGD])
    assert started == ["seed-1", "lr0-0"]
    assert "kept, already finished in" in capsys.readouterr().out

    # A diagnostic of a model about to be trained again stops the bench before anything runs.
    started.clear()
    (tmp_path / "blind-1").mkdir()
    with pytest.raises(PlanError, match="blind-1 evaluated a model"):
        run.main(["--seeds", "0", "1", "--controls", "--out", str(tmp_path), *book, "--", *SGD])
    assert started == []


def test_jobs_below_one_are_refused(tmp_path):
    with pytest.raises(SystemExit):
        run.main(["--jobs", "0", "--out", str(tmp_path)])
