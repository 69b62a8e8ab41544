# Run: .venv/bin/python -m pytest tests/test_bench_ledger.py -x -q
"""bench/learning/ledger.py: a finished run is recorded, small, in the committed ledger; a later
sitting whose folder lacks it reads the same numbers from there, keeps it only for the same
settings, trains a seed again when a diagnostic needs its model, and names the machines its
rows came from; the committed ledger itself reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.learning import ledger, run
from bench.learning.schedule import PlanError
from tests.helpers.bench_runs import INSTRUCTIONS, SGD
from tests.helpers.bench_runs import before_after as _before_after
from tests.helpers.bench_runs import finished as _finished
from tests.helpers.bench_runs import record as _record


def _trained(out: Path, name: str, seed: int, rise: int, **changed) -> None:
    """A finished training as harness.train leaves it, with per-instruction rows and a curve."""
    _finished(out / name, run.train_command(name, seed, out, SGD), **changed)
    data = _before_after({i: (1, 1 + rise) for i in INSTRUCTIONS})
    data["weight_versions"] = {"before": [0] * 96, "after": [12] * 96}  # dropped by the entry
    (out / name / "before_after.json").write_text(json.dumps(data))
    (out / name / "reward_curve.json").write_text(json.dumps({"steps": [1, 2],
                                                              "reward_mean": [0.2, 0.4]}))


def _evaluated(out: Path, name: str, word: str) -> None:
    rollouts = out / name / "rollouts"
    rollouts.mkdir(parents=True)
    record = _record("lookup-key-answer-t0-table-swap", 1.0, "cat key.txt",
                     f"echo {word} > answer.txt")
    record["trace"]["turns"][0].update(prompt_token_ids=[1] * 500, per_token_logps=[-0.1] * 9)
    (rollouts / "0.json").write_text(json.dumps(record))
    (out / name / "eval_summary.json").write_text("{}")


def test_a_sitting_without_the_folders_reads_the_same_table_from_the_ledger(tmp_path):
    first, book = tmp_path / "machine-a" / "learning", tmp_path / "ledger"
    for s, rise in enumerate((3, 4)):
        _trained(first, f"seed-{s}", s, rise)
    _trained(first, "flip-0", 0, -1)
    _evaluated(first, "swap-0", "x")
    args = ([0, 1], ["flip"], [0])
    there = run.report(first, *args, ledger=book)
    assert sorted(p.name for p in book.iterdir()) == ["flip-0.json", "seed-0.json",
                                                      "seed-1.json", "swap-0.json"]
    entry = json.loads((book / "seed-1.json").read_text())
    assert entry["settings"]["learning_rate"] == 0.25 and entry["reward_mean"] == [0.2, 0.4]
    assert "weight_versions" not in entry["before_after"] and entry["provenance"]["cores"] >= 1
    swap = json.loads((book / "swap-0.json").read_text())["records"][0]
    assert "prompt_token_ids" not in swap["trace"]["turns"][0]  # responses only

    elsewhere = tmp_path / "machine-b" / "learning"
    here = run.report(elsewhere, *args, ledger=book)
    strip = lambda r: {k: v for k, v in r.items() if k != "from_ledger"}  # noqa: E731
    assert {n: strip(r) for n, r in here["runs"].items()} == {
        n: strip(r) for n, r in there["runs"].items()}
    assert here["verdict"] == there["verdict"] and here["swap"] == there["swap"]
    assert here["swap"]["answered"] == 1
    assert there["from_ledger"] == {}
    assert set(here["from_ledger"]) == {"seed-0", "seed-1", "flip-0", "swap-0"}
    text = "\n".join(run.table_lines(here))
    assert "read from the ledger, not this folder: seed-0, seed-1, flip-0, swap-0" in text
    assert f"{ledger._cpu()} (" in text
    assert run.reward_curves(elsewhere, ["seed-0"], book)["runs"]["seed-0"] == [0.2, 0.4]
    assert run.read_result(elsewhere / "seed-0") is None  # no ledger: not there


def test_the_ledger_is_rewritten_only_when_a_result_changes_and_never_across_settings(tmp_path):
    out, book = tmp_path / "learning", tmp_path / "ledger"
    _trained(out, "seed-0", 0, 3)
    assert ledger.record_finished(out, book, ["seed-0", "seed-1"]) == ["seed-0"]
    assert ledger.record_finished(out, book, ["seed-0"]) == []  # the same result: no churn
    (out / "seed-0" / "before_after.json").write_text(json.dumps(
        _before_after({i: (1, 8) for i in INSTRUCTIONS})))
    assert ledger.record_finished(out, book, ["seed-0"]) == ["seed-0"]
    other = tmp_path / "other"
    _trained(other, "seed-0", 0, 3, learning_rate=0.5)
    with pytest.raises(PlanError, match="learning_rate: 0.25 there, 0.5 now"):
        ledger.record_finished(other, book, ["seed-0"])
    (book / "seed-0.json").write_text("{not json")
    with pytest.raises(SystemExit, match="is not JSON.*git checkout"):
        ledger.read(book, "seed-0")
    assert ledger.record_finished(out, None, ["seed-0"]) == []


def _bench(out: Path, book: Path, started: list[str], *flags: str) -> None:
    """The bench on seed 0 (flags given later win: `--controls` alone drops flip-0)."""
    run.main(["--seeds", "0", "--controls", "flip", "--control-seeds", "0", "--out", str(out),
              "--ledger", str(book), *flags, "--", *SGD])


def test_a_run_in_the_ledger_is_kept_only_for_the_same_settings(tmp_path, monkeypatch, capsys):
    started: list[str] = []
    monkeypatch.setattr(run, "run_jobs", lambda jobs, parallel, on_success=None: started.extend(
        j.name for j in jobs))
    book = tmp_path / "ledger"
    _trained(tmp_path / "a", "seed-0", 0, 3)
    _trained(tmp_path / "a", "flip-0", 0, -1, shuffle_rewards=False, flip_rewards=True)
    ledger.record_finished(tmp_path / "a", book, ["seed-0", "flip-0"])

    _bench(tmp_path / "b", book, started, "--no-diagnostics")
    assert started == []
    assert "kept, already finished in" in capsys.readouterr().out

    with pytest.raises(PlanError, match="ledger's entry for seed-0 .*learning_rate: 0.25 there, "
                                        "0.5 now"):
        run.main(["--seeds", "0", "--controls", "--no-diagnostics", "--out", str(tmp_path / "c"),
                  "--ledger", str(book), "--", *SGD, "--learning-rate", "0.5"])


def test_a_diagnostic_whose_model_is_elsewhere_trains_its_seed_again(tmp_path, monkeypatch,
                                                                      capsys):
    started: list[str] = []
    monkeypatch.setattr(run, "run_jobs", lambda jobs, parallel, on_success=None: started.extend(
        j.name for j in jobs))
    # The variants' task folders are what the diagnostics would read; this test only plans.
    monkeypatch.setattr("harness.tasks.lookup.generate", lambda *args, **kwargs: None)
    book = tmp_path / "ledger"
    _trained(tmp_path / "a", "seed-0", 0, 3)
    _evaluated(tmp_path / "a", "blind-0", "x")
    ledger.record_finished(tmp_path / "a", book, ["seed-0", "blind-0"])

    _bench(tmp_path / "b", book, started, "--controls")
    # swap-0 is missing and seed-0's model is not here: seed-0 again, then both diagnostics
    # (the ledger's blind-0 evaluated the old model).
    assert started == ["seed-0", "swap-0", "blind-0"]
    assert "seed-0: kept in the ledger, but swap-0 needs its model" in capsys.readouterr().out

    # With the run and its model on this machine, only the missing diagnostic runs.
    started.clear()
    _trained(tmp_path / "c", "seed-0", 0, 3)
    (tmp_path / "c" / "seed-0" / "trainer" / "model").mkdir(parents=True)
    _bench(tmp_path / "c", book, started, "--controls")
    assert started == ["swap-0"]


def test_each_job_is_recorded_as_it_finishes(tmp_path):
    out, book = tmp_path / "learning", tmp_path / "ledger"
    _trained(out, "seed-0", 0, 3)
    seen: list[str] = []
    jobs = [run.Job("seed-0", ["true"], out / "seed-0"), run.Job("seed-1", ["false"],
                                                                 out / "seed-1")]
    codes = run.run_jobs(jobs, 1, on_success=lambda job: seen.extend(
        ledger.record_finished(out, book, [job.name])))
    assert codes == {"seed-0": 0, "seed-1": 1} and seen == ["seed-0"]


def test_report_only_refuses_a_row_of_other_settings_and_shows_one_in_progress(tmp_path,
                                                                                capsys):
    out, book = tmp_path / "learning", tmp_path / "ledger"
    _trained(out, "seed-0", 0, 3)
    (out / "seed-1").mkdir()  # still training: no before_after.json yet
    report = ["--report-only", "--seeds", "0", "1", "--controls", "--no-diagnostics",
              "--out", str(out), "--ledger", str(book)]
    run.main([*report, "--", *SGD])
    assert "seed-1     (not in this folder or the ledger" in capsys.readouterr().out
    assert (book / "seed-0.json").exists()
    # The same folder read as another setting's bench (no `-- --optimizer sgd ...`): refused.
    with pytest.raises(PlanError, match="seed-0 was trained with other settings.*optimizer: "
                                        "'sgd' there, 'adamw' now"):
        run.main(report)
    # And from the ledger alone, on a machine without the folder.
    with pytest.raises(PlanError, match="ledger's entry for seed-0 .*optimizer"):
        run.main([*report[:-4], "--out", str(tmp_path / "elsewhere"), "--ledger", str(book)])


def test_an_evaluation_still_running_is_not_read_as_the_diagnostics_result(tmp_path):
    out, book = tmp_path / "learning", tmp_path / "ledger"
    _evaluated(out, "swap-0", "x")
    (out / "swap-0" / "eval_summary.json").unlink()  # its first rollout is written, not its end
    result = run.report(out, [0], [], [0], ledger=book)
    assert result["swap"] is None and result["unfinished"] == ["swap-0"]
    assert not (book / "swap-0.json").exists()
    assert "not read, still running or stopped before its end: swap-0" in "\n".join(
        run.table_lines(result))


def test_an_entry_from_another_warm_start_is_not_kept(tmp_path, monkeypatch):
    # The settings name no weights (--model None: the committed warm start), and a warm start is
    # retrained under the same name now and then: the entry's weights' sha256 tells them apart.
    started: list[str] = []
    monkeypatch.setattr(run, "run_jobs", lambda jobs, parallel, on_success=None: started.extend(
        j.name for j in jobs))
    book = tmp_path / "ledger"
    _trained(tmp_path / "a", "seed-0", 0, 3)
    ledger.record_finished(tmp_path / "a", book, ["seed-0"])
    entry = json.loads((book / "seed-0.json").read_text())
    build = json.loads((Path(run.__file__).resolve().parents[2] / "models" / "tiny-qwen3-lookup"
                        / "BUILD.json").read_text())
    assert entry["start_model"] == {"committed": "tiny-qwen3-lookup",
                                    "weights_sha256": build["files"]["model.safetensors"]}
    entry["start_model"]["weights_sha256"] = "0" * 64
    (book / "seed-0.json").write_text(json.dumps(entry))
    with pytest.raises(PlanError, match="ledger's entry for seed-0 .*the model it starts from"):
        _bench(tmp_path / "b", book, started, "--no-diagnostics", "--controls")
    with pytest.raises(PlanError, match="the model it starts from"):
        ledger.record_finished(tmp_path / "a", book, ["seed-0"])
    assert started == []


def test_the_default_ledger_is_in_the_repository_beside_the_bench(tmp_path):
    assert ledger.default_ledger(Path("runs/learning-sgd")) == (
        Path(run.__file__).resolve().parent / "results" / "learning-sgd")


def test_every_committed_ledger_entry_reads_as_the_table_reads_it():
    entries = sorted(ledger.LEDGER_ROOT.glob("*/*.json"))
    for path in entries:
        entry = ledger.read(path.parent, path.stem)
        assert entry["kind"] in ("training", "diagnostic"), path
        assert {"cpu", "cores", "finished"} <= set(entry["provenance"]), path
        if entry["kind"] == "training":
            result = run.read_result(Path("/nonexistent") / path.stem, path.parent)
            assert result["per_instruction"] and result["change_points"] is not None, path
            assert entry["settings"]["seed"] == int(path.stem.rsplit("-", 1)[1]), path
            assert "weights_sha256" in entry["start_model"], path  # the committed warm starts
        else:
            assert entry["records"] and all("task_id" in r for r in entry["records"]), path
