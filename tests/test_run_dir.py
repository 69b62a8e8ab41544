"""Run folders never lose work: a fresh folder per run, runs/latest always names one that exists,
an earlier run's folder is refused without --resume or --overwrite, and checkpoint pruning never
deletes the checkpoint just written.

Run: .venv/bin/python -m pytest tests/test_run_dir.py -q

The bug this guards: train and eval both defaulted to `runs/latest`; a second run appended to the
first's rollouts.jsonl and metrics.jsonl, and pruning by step number deleted its checkpoint-1
and -2 as soon as they were saved (an earlier run had left checkpoint-11 and -12), leaving
`latest` naming a deleted folder.
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from harness.shared.run_dir import RunDirError, check_run_dir, fresh_run_dir, prepare_run_dir
from launchers.paths import REPO_ROOT


def test_no_output_dir_makes_a_new_folder_each_run_and_links_latest(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first = prepare_run_dir(None, "train", runs=runs)
    (first / "rollouts.jsonl").write_text("{}\n")
    second = prepare_run_dir(None, "eval", runs=runs)
    assert first != second and first.is_dir() and second.is_dir()
    assert first.name.endswith("-train") and second.name.endswith("-eval")
    assert (first / "rollouts.jsonl").read_text() == "{}\n"  # untouched by the second run
    latest = runs / "latest"
    assert latest.is_symlink() and latest.resolve() == second.resolve()
    # Two runs in one second still get two folders.
    now = datetime(2026, 12, 3, 8, 0, 0, tzinfo=UTC)
    a = fresh_run_dir("train", runs, now)
    a.mkdir()
    assert fresh_run_dir("train", runs, now) != a


def test_an_earlier_runs_folder_is_refused_with_the_fix(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "rollouts.jsonl").write_text("earlier\n")
    (out / "trainer").mkdir()
    with pytest.raises(RunDirError) as err:
        prepare_run_dir(str(out), "train")
    message = str(err.value)
    assert str(out) in message and "rollouts.jsonl" in message
    assert "--resume" in message and "--overwrite" in message
    assert (out / "rollouts.jsonl").read_text() == "earlier\n"  # nothing touched
    # eval has no --resume to offer
    assert "--resume" not in "\n".join(check_run_dir(str(out), "eval"))


def test_resume_keeps_the_folder_and_overwrite_empties_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    (out / "trainer").mkdir(parents=True)
    (out / "rollouts.jsonl").write_text("earlier\n")
    assert prepare_run_dir(str(out), "train", resume=True) == out
    assert (out / "rollouts.jsonl").exists() and (out / "trainer").is_dir()
    (out / "capture").mkdir()  # a launcher's service may already be logging here
    assert prepare_run_dir(str(out), "train", overwrite=True) == out
    assert sorted(p.name for p in out.iterdir()) == ["capture"]
    # --resume and --overwrite together, and --resume with no folder, are refused.
    assert any("contradict" in p for p in check_run_dir(str(out), "train", resume=True,
                                                         overwrite=True))
    assert any("--resume needs --output-dir" in p for p in check_run_dir(None, "train",
                                                                         resume=True))


def test_a_folder_holding_only_the_services_capture_log_is_this_runs(tmp_path: Path) -> None:
    # launchers/hf_jobs.py starts the rollout service (its capture log: <run>/capture) first.
    out = tmp_path / "run"
    (out / "capture").mkdir(parents=True)
    assert check_run_dir(str(out), "train") == []


def test_torchrun_needs_an_explicit_folder_every_rank_can_agree_on() -> None:
    problems = check_run_dir(None, "train", world_size=3)
    assert len(problems) == 1 and "--output-dir is required under torchrun" in problems[0]
    assert check_run_dir("runs/x", "train", world_size=3) == []


def test_latest_follows_the_last_run_and_resume_through_it_writes_the_real_folder(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = prepare_run_dir(None, "train")  # relative runs/, as on the command line
    (run / "trainer").mkdir()
    assert Path("runs/latest").resolve() == run.resolve()
    resumed = prepare_run_dir("runs/latest", "train", resume=True)
    assert resumed.resolve() == run.resolve() and not resumed.is_symlink()
    assert Path("runs/latest").resolve() == run.resolve()
    # A dangling link is refused rather than written through.
    os.symlink("nowhere", "runs/dangling")
    assert "does not exist" in check_run_dir("runs/dangling", "train")[0]


def test_an_old_style_latest_folder_is_never_replaced(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    (runs / "latest").mkdir(parents=True)
    (runs / "latest" / "summary.json").write_text("{}")
    run = prepare_run_dir(None, "train", runs=runs)
    assert run.is_dir() and (runs / "latest" / "summary.json").exists()  # an earlier run, kept


def test_train_refuses_an_earlier_runs_folder_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    run = subprocess.run([sys.executable, "-m", "harness.train", "--output-dir", str(out)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stderr[-2000:]
    said = " ".join(run.stderr.split())  # the console wraps long lines
    assert "already holds a run (metrics.jsonl)" in said and "--overwrite" in said
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]


# --- checkpoint pruning --------------------------------------------------------------------------

def _save(root: Path, step: int, model, limit: int) -> Path:
    import torch

    from trainer.checkpoint import TrainerState, save_checkpoint
    from trainer.distributed import DistInfo

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    single = DistInfo(0, 1, 0, torch.device("cpu"), "test: one process")
    return save_checkpoint(root, model=model, optimizer=optimizer, scheduler=None,
                           state=TrainerState(step=step), dist_info=single, total_limit=limit)


def test_pruning_keeps_the_checkpoint_just_written_after_an_earlier_runs_higher_steps(
        tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from trainer.checkpoint import find_latest

    model = AutoModelForCausalLM.from_pretrained(REPO_ROOT / "models" / "tiny-qwen3")
    root = tmp_path / "trainer"
    for step in (11, 12):  # an earlier run's
        _save(root, step, model, limit=2)
    first = _save(root, 1, model, limit=2)  # a new run in the same folder (--resume-less reuse)
    assert first.is_dir(), "the checkpoint just written was deleted"
    assert find_latest(root) == first
    assert sorted(p.name for p in root.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-12"]
    second = _save(root, 2, model, limit=2)
    assert find_latest(root) == second and first.is_dir()
    assert sorted(p.name for p in root.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    # A limit of 1 keeps exactly the one just written.
    third = _save(root, 3, model, limit=1)
    assert [p.name for p in root.glob("checkpoint-*")] == [third.name]
    assert find_latest(root) == third
