"""Where a train or eval run writes: a fresh folder each time, and never over another run's work.

Why this module exists: train and eval both used to default to `runs/latest`, a plain folder
every run wrote into. `rollouts.jsonl` and `metrics.jsonl` were appended to, and a new run's
first checkpoints were pruned as soon as they were saved because an earlier run's had higher
step numbers. So the rules are:

- No --output-dir: a new folder `runs/<UTC time>-train` (or `-eval`), never one that exists.
- `runs/latest` is a symlink to the newest run folder directly under `runs/` (replaced
  atomically, pointed only at a folder that exists), so `python -m harness.view runs/latest`
  and `--resume --output-dir runs/latest` follow the last run.
- An --output-dir that exists and holds anything is refused, with the fix, unless --resume
  (continue that run from its latest checkpoint) or --overwrite (delete what is there first).
  One entry does not count: `capture/`, the capture proxy's per-call log, which a rollout
  service started for this same run by a launcher (launchers/hf_jobs.py) writes into the run
  folder before the trainer starts; its records are keyed by session and node ids reserved
  durably, so an earlier log never collides with a new one.

Under torchrun every rank must write the same folder, and the ranks cannot agree on a clock
reading before their process group exists, so a distributed run needs an explicit --output-dir
(launchers/hf_jobs.py always passes one). Only rank 0 checks, creates and links the folder.
"""

from __future__ import annotations

import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["RUNS", "RunDirError", "check_run_dir", "fresh_run_dir", "prepare_run_dir",
           "update_latest"]

RUNS = Path("runs")  # relative to the working directory, as every run's default has been
LATEST = "latest"
# Entries a launcher's rollout service may write into this run's folder before the trainer
# starts (harness.serve --data-dir: <data-dir>/capture); not an earlier run's records.
SHARED_ENTRIES = frozenset({"capture"})


class RunDirError(ValueError):
    """The output folder cannot be used as asked; the message says why and what to do."""


def fresh_run_dir(kind: str, runs: Path = RUNS, now: datetime | None = None) -> Path:
    """`runs/<UTC time>-<kind>`, a name no folder has yet (a suffix if two start in one second)."""
    stamp = f"{(now or datetime.now(UTC)):%Y%m%dT%H%M%SZ}-{kind}"
    candidate, n = runs / stamp, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = runs / f"{stamp}-{n}"
    return candidate


def _earlier_entries(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name not in SHARED_ENTRIES)


def check_run_dir(output_dir: str | None, kind: str, *, resume: bool = False,
                  overwrite: bool = False, world_size: int | None = None) -> list[str]:
    """Every problem with using `output_dir` for this run, each with its fix ([] when fine).

    Touches nothing: harness.run.preflight reports these beside the other settings' problems."""
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    problems = []
    if resume and overwrite:
        problems.append("--resume and --overwrite contradict each other: --resume continues the "
                        "run in --output-dir, --overwrite deletes its files; give one")
    if output_dir is None:
        if resume:
            problems.append("--resume needs --output-dir: the run folder to continue, e.g. "
                            f"--output-dir {RUNS / LATEST} for the last run")
        if world_size > 1:
            problems.append(f"--output-dir is required under torchrun ({world_size} ranks): "
                            "every rank must write the same run folder, and a default name "
                            "taken from each rank's clock could differ; give one, e.g. "
                            f"--output-dir {RUNS}/my-{kind}")
        return problems
    path = Path(output_dir)
    if path.is_symlink() and not path.exists():
        return [*problems, f"--output-dir {output_dir} is a link to {os.readlink(path)}, which "
                           "does not exist; give a run folder that does, or a new name"]
    if path.exists() and not path.is_dir():
        return [*problems, f"--output-dir {output_dir} is a file, not a folder; give a folder"]
    earlier = _earlier_entries(path) if path.is_dir() else []
    if earlier and not (resume or overwrite):
        shown = ", ".join(earlier[:6]) + (", ..." if len(earlier) > 6 else "")
        problems.append(
            f"--output-dir {output_dir} already holds a run ({shown}). Give a new folder (or "
            f"none: each run gets its own under {RUNS}/)" +
            (", --resume to continue that run from its latest checkpoint," if kind == "train"
             else ",") + " or --overwrite to delete its files first")
    return problems


def prepare_run_dir(output_dir: str | None, kind: str, *, resume: bool = False,
                    overwrite: bool = False, runs: Path = RUNS) -> Path:
    """The folder this run writes, created, with `runs/latest` pointed at it when it is under runs/.

    Raises RunDirError with check_run_dir's problems. With `overwrite`, the earlier run's files
    are deleted here (all but SHARED_ENTRIES); with `resume` they are kept for the trainer.
    """
    problems = check_run_dir(output_dir, kind, resume=resume, overwrite=overwrite, world_size=1)
    if problems:
        raise RunDirError("; ".join(problems))
    if output_dir is None:
        path = fresh_run_dir(kind, runs)
    else:
        path = Path(output_dir)
        if path.is_dir() and overwrite:
            for name in _earlier_entries(path):
                entry = path / name
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        if path.is_symlink():
            path = path.resolve()  # --output-dir runs/latest: the run folder it names
    path.mkdir(parents=True, exist_ok=True)
    if path.resolve().parent == runs.resolve():
        update_latest(path, runs)
    return path


def update_latest(run_dir: Path, runs: Path = RUNS) -> Path | None:
    """Point `runs/latest` at `run_dir` (which exists), replacing the link atomically.

    A `runs/latest` that is a real folder (the layout before this module) is left alone and
    None is returned: it holds an earlier run, and nothing here deletes a run."""
    link = runs / LATEST
    if run_dir.name == LATEST or (link.exists() and not link.is_symlink()):
        return None
    if not run_dir.is_dir():
        raise RunDirError(f"{run_dir} is not a folder; runs/latest must name one that exists")
    tmp = runs / f".{LATEST}.{os.getpid()}"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    tmp.symlink_to(run_dir.resolve().name)  # relative: the runs folder can move with its runs
    tmp.replace(link)
    return link
