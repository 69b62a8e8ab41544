"""The bench's results kept in git, so one bench can be finished over several sittings and machines.

A full bench is 14 trainings and 8 evaluations, longer than a sitting here, and a run's folder
under runs/ (git-ignored) does not outlive the machine it was trained on. So each finished run is
also written, small, to a ledger: one JSON file per run under bench/learning/results/<OUT's
name>/, meant to be committed. A later sitting of the same bench command, on this machine or
another, reads a run it does not find in OUT from the ledger, keeps it when its recorded settings
are this command's (the same rule as a folder: bench/learning/schedule.py) and trains only the
rest; `--report-only` prints the table from OUT and the ledger together.

What an entry holds is what the table reads, never less: a training's settings, its before/after
pass rates, per-instruction rows (stats.per_instruction_change recomputes the changes from
them), per-step rates, the weight check and its reward curve; a diagnostic's scored rollouts with
the responses the swap test reads the written word from. What it drops: token ids, logprobs, the
per-rollout weight versions (the weight check's verdict stays), the model. Each entry also says
where it came from (the CPU, core count, the commit the ledger was written at, when the run
finished), and the table names every machine its rows came from: pooling runs across machines is
what the ledger is for, and a reader must see that it happened.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

from bench.learning.schedule import PlanError, differences
from bench.learning.stats import read_records

LEDGER_ROOT = Path(__file__).resolve().parent / "results"
# before_after.json's keys a training's entry keeps (the rest are per-rollout detail).
TRAINING_KEYS = ("before_pass_rate", "after_pass_rate", "change_points", "seed", "eval_tasks",
                 "per_task", "step_rates", "weight_check", "shuffled_rewards", "flipped_rewards",
                 "learning_rate")


def default_ledger(out: Path) -> Path:
    return LEDGER_ROOT / out.resolve().name


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=LEDGER_ROOT.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def provenance(finished: Path) -> dict:
    """Where and when the run behind an entry ran (`finished` is its last-written file)."""
    when = datetime.datetime.fromtimestamp(finished.stat().st_mtime, datetime.UTC)
    return {"cpu": _cpu(), "cores": os.cpu_count(), "ledger_written_at_commit": _commit(),
            "finished": when.isoformat(timespec="seconds")}


def start_model(settings: dict) -> dict:
    """Which weights a run of these settings starts from, as this checkout resolves them: the
    settings name `--model` (None: the committed warm start for the agent and tasks), and a
    committed warm start is retrained now and then under the same name, so its weights' sha256
    is what tells two runs' starts apart. A hub model is named by its commit; a local directory
    by its path and weights' size (hashing a 64 GB checkpoint per entry is not worth it)."""
    from launchers.models import ModelError, resolve_model

    try:
        model = resolve_model(settings.get("model"), harness=settings.get("harness"),
                              tasks=settings.get("tasks"))
    except ModelError as err:
        return {"unresolved": str(err)}
    if model.source == "hub":
        return {"hub": f"{model.repo_id}@{model.revision}"}
    weights = sorted(model.path.glob("*.safetensors"))
    if model.source == "tiny":
        digest = hashlib.sha256()
        for path in weights:
            digest.update(path.read_bytes())
        return {"committed": model.path.name, "weights_sha256": digest.hexdigest()}
    return {"local": str(model.path), "weights_bytes": sum(p.stat().st_size for p in weights)}


def training_entry(folder: Path) -> dict:
    """A finished training's entry, from its folder (settings.json, before_after.json and
    reward_curve.json, as harness.train writes them)."""
    before_after = json.loads((folder / "before_after.json").read_text())
    curve = folder / "reward_curve.json"
    settings = json.loads((folder / "settings.json").read_text())
    return {"kind": "training", "settings": settings, "start_model": start_model(settings),
            "before_after": {k: before_after.get(k) for k in TRAINING_KEYS},
            "reward_mean": json.loads(curve.read_text())["reward_mean"] if curve.exists()
            else None,
            "provenance": provenance(folder / "before_after.json")}


def diagnostic_entry(folder: Path) -> dict:
    """A finished evaluation's entry: each rollout's task, reward, cause and responses."""
    records = [{"task_id": r.get("task_id"), "env_reward": r.get("env_reward"),
                "cause": r.get("cause"),
                "trace": {"turns": [{"response": t.get("response")}
                                    for t in (r.get("trace") or {}).get("turns", [])]}}
               for r in read_records(folder)]
    return {"kind": "diagnostic", "records": records,
            "provenance": provenance(folder / "eval_summary.json")}


def read(ledger: Path | None, name: str) -> dict | None:
    path = None if ledger is None else ledger / f"{name}.json"
    if path is None or not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SystemExit(f"bench/learning: the ledger entry {path} is not JSON ({err}); restore "
                         "it with `git checkout` or delete it to run it again") from err


def write(ledger: Path, name: str, entry: dict) -> Path:
    """Write one entry whole (a temporary file renamed into place: never half an entry)."""
    ledger.mkdir(parents=True, exist_ok=True)
    path = ledger / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    if "records" in entry:  # one rollout a line: half the size of an indented tree
        head = json.dumps({k: v for k, v in entry.items() if k != "records"}, indent=1)
        rows = ",\n".join(json.dumps(r) for r in entry["records"])
        text = head[:-2] + f',\n "records": [\n{rows}\n ]\n}}'
    else:
        text = json.dumps(entry, indent=1)
    tmp.write_text(text + "\n")
    tmp.replace(path)
    return path


def _same(a: dict, b: dict) -> bool:
    """Two entries of one result: equal but for the commit each was written at."""
    strip = lambda e: {**e, "provenance": {k: v for k, v in e.get("provenance", {}).items()  # noqa: E731
                                           if k != "ledger_written_at_commit"}}
    return strip(a) == strip(b)


def record_finished(out: Path, ledger: Path | None, names: list[str]) -> list[str]:
    """Write the entry of every named run that finished in OUT (a training: before_after.json
    and settings.json; an evaluation: eval_summary.json); returns the names written. A folder of
    the same settings as its entry replaces it (the folder is the newer result; the old entry is
    in git's history); one of other settings stops here, naming what differs, rather than
    overwriting a row of another setting."""
    if ledger is None:
        return []
    written = []
    for name in names:
        folder = out / name
        if (folder / "before_after.json").exists() and (folder / "settings.json").exists():
            entry = training_entry(folder)
        elif (folder / "eval_summary.json").exists():
            entry = diagnostic_entry(folder)
        else:
            continue
        old = read(ledger, name)
        if old is not None and "settings" in entry:
            diff = differences(old.get("settings", {}), entry["settings"])
            if old.get("start_model") != entry["start_model"]:
                diff.append(f"the model it starts from: {old.get('start_model')} there, "
                            f"{entry['start_model']} now")
            if diff:
                raise PlanError(f"bench/learning: {folder} and the ledger's {ledger / name}.json "
                                "were trained with other settings (" + "; ".join(diff) + "); "
                                "bench into another --out or --ledger")
        if old is None or not _same(old, entry):
            write(ledger, name, entry)
            written.append(name)
    return written
