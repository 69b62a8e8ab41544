"""Which of the bench's runs to start, which finished ones to keep, and how many to run at once.

A full bench is 14 trainings and 8 evaluations: hours on this machine, more than one sitting. So
a rerun of the same bench command keeps every run that already finished, in its folder or (on
another machine) as its entry in the committed ledger (bench/learning/ledger.py), and starts only
the rest, but only a run whose recorded settings (its settings.json, written by harness.train)
are exactly what the bench's command gives now: a folder trained with another learning rate,
optimizer or code default would otherwise be read into the table as this setting's row, with
nothing to show it. Such a run, or a folder a run left unfinished, stops the bench before
anything starts, naming the run and what differs.

`--jobs N` runs N trainings at once. Only synchronous runs (`--max-staleness 0`) may: each is then
a function of its seed, so a neighbour's load changes its wall clock and never its numbers; an
asynchronous run's weights per rollout follow the machine's load (README: Reproducible runs).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

# A setting that names where the run is, not what it computes.
PLACE_SETTINGS = ("output_dir",)


class PlanError(SystemExit):
    """The bench's folder holds something it must not read or overwrite; says what to do."""


@dataclass(frozen=True)
class Job:
    name: str
    command: list[str]
    folder: Path


def planned_settings(command: list[str]) -> dict:
    """The settings harness.train will record for this command, read by its own parser."""
    from harness.shared.run_config import build_parser, settings_from_args

    argv = command[command.index("harness.train") + 1:]
    settings = settings_from_args(build_parser("python -m harness.train", ""), argv)
    return json.loads(json.dumps(vars(settings), default=str))


def differences(recorded: dict, planned: dict) -> list[str]:
    keys = sorted((set(recorded) | set(planned)) - set(PLACE_SETTINGS))
    return [f"{k}: {recorded.get(k, '(absent)')!r} there, {planned.get(k, '(absent)')!r} now"
            for k in keys if recorded.get(k, "(absent)") != planned.get(k, "(absent)")]


def training_is_kept(job: Job, entry: dict | None = None) -> bool:
    """True for a finished run of exactly this command's settings, in its folder or, where the
    folder is absent, as its ledger entry (bench/learning/ledger.py); False for neither; a
    PlanError for anything else."""
    planned = planned_settings(job.command)
    if entry is not None:
        from bench.learning.ledger import start_model

        diff = differences(entry.get("settings", {}), planned)
        now = start_model(planned)
        if entry.get("start_model") != now:
            diff.append(f"the model it starts from: {entry.get('start_model')} there, {now} now")
        if diff:
            raise PlanError(f"bench/learning: the ledger's entry for {job.name} was trained with "
                            "other settings than this bench's command gives (" + "; ".join(diff)
                            + "); bench into another --out or --ledger")
    if not job.folder.exists():
        return entry is not None
    settings = job.folder / "settings.json"
    if not (job.folder / "before_after.json").exists():
        raise PlanError(f"bench/learning: {job.folder} holds an unfinished run (no "
                        "before_after.json); delete it to run it again")
    if not settings.exists():
        raise PlanError(f"bench/learning: {job.folder} has no settings.json, so which settings "
                        "trained it is unknown; delete it, or bench into another --out")
    diff = differences(json.loads(settings.read_text()), planned)
    if diff:
        raise PlanError(f"bench/learning: {job.folder} was trained with other settings than "
                        "this bench's command gives (" + "; ".join(diff) + "); bench into "
                        "another --out, or delete the folder to train it again")
    return True


def diagnostic_is_kept(job: Job, model_retrained: bool, entry: dict | None = None) -> bool:
    """True for a finished evaluation of a model this bench keeps; a PlanError for a folder of
    a model about to be trained again (it would describe the old model) or an unfinished one.
    A ledger entry (no folder) of a model about to be trained again is not kept: the new
    evaluation replaces it, and the old one stays in git's history."""
    if not job.folder.exists():
        return entry is not None and not model_retrained
    if model_retrained:
        raise PlanError(f"bench/learning: {job.folder} evaluated a model this bench is about to "
                        "train again; delete it")
    if not (job.folder / "eval_summary.json").exists():
        raise PlanError(f"bench/learning: {job.folder} holds an unfinished evaluation (no "
                        "eval_summary.json); delete it to run it again")
    return True


def check_parallel(jobs: list[Job], parallel: int) -> None:
    """Refuse concurrent asynchronous trainings (their numbers would follow each other's load)."""
    if parallel <= 1:
        return
    asynchronous = [j.name for j in jobs if "harness.train" in j.command
                    and planned_settings(j.command)["max_staleness"] != 0]
    if asynchronous:
        raise PlanError(f"bench/learning: --jobs {parallel} runs trainings at once, which only "
                        "synchronous runs may (their results are then functions of their seeds); "
                        f"{', '.join(asynchronous)} would train asynchronously: add "
                        "`-- --max-staleness 0`, or use --jobs 1")


def run_jobs(jobs: list[Job], parallel: int = 1,
             on_success: Callable[[Job], object] | None = None) -> dict[str, int]:
    """Run the commands, `parallel` at a time, each one's output into FOLDER.log beside its
    folder (one at a time, it also goes to the terminal); `on_success(job)` runs as each one
    exits 0 (the bench records it in its ledger then, so a sitting cut short keeps what
    finished); returns each one's exit code."""

    def one(job: Job) -> int:
        start = time.monotonic()
        print(f"$ {' '.join(job.command)}", flush=True)
        if parallel == 1:
            code = subprocess.run(job.command, check=False).returncode
        else:
            job.folder.parent.mkdir(parents=True, exist_ok=True)
            with open(job.folder.with_name(job.folder.name + ".log"), "w") as log:
                code = subprocess.run(job.command, stdout=log, stderr=subprocess.STDOUT,
                                      check=False).returncode
        minutes = (time.monotonic() - start) / 60
        if code == 0 and on_success is not None:
            on_success(job)
        print(f"{job.name}: " + ("done" if code == 0 else f"exited {code}; its row will be "
                                 "missing") + f" ({minutes:.1f} min)", flush=True)
        return code

    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        return dict(zip([j.name for j in jobs], pool.map(one, jobs), strict=True))
