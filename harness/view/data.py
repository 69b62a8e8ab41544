"""Reading a run directory for the viewer: what the page asks for, built from files alone.

A run directory (`--output-dir` of harness.train / harness.eval) holds

    settings.json            the run's settings (train; eval runs may lack it)
    summary.json             end-of-run summary (train), eval_summary.json (eval)
    rollouts.jsonl           one light line per finished rollout (no trace): the index
    rollouts/NNNNN-task.json one file per rollout: record + outcome + the whole TrainingTrace
    trainer/metrics.jsonl    one line per trainer step (reward, staleness, tokens, time/...)
    trainer/groups.jsonl     one line per trained/skipped group: per rollout reward, parts,
                             advantage (trainer/groups.py append_group_records)
    eval-before/, eval-after/  a train run's held-out evaluation (--eval-tasks): each its own
                             rollouts.jsonl + rollouts/ (a *side* of the run: `RunData.side()`)
    before_after.json        the held-out pass rates before and after, per task and overall

The index never opens a rollout file: 10,000 rollouts are 10,000 short lines, parsed once and
then only the appended tail is read on the next request (a running run keeps appending), so a
page opens in well under a second (bench/view/bench.py measures it). A rollout's trace is read
when that rollout is opened, and its token ids decoded then, each distinct id once.

Nothing here needs the proxy, the engine or the trainer alive, and nothing is invented: a value
the run did not record (an advantage for a group that was never trained, a verifier output the
record lacks) is returned as None and shown as "not recorded", never as 0.
"""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

from harness.shared.tables import PASS_THRESHOLD  # a rollout passes when env_reward >= it

__all__ = ["EVAL_SIDES", "JsonlTail", "RunData", "Tokenizer", "find_tokenizer"]

EVAL_SIDES = ("eval-before", "eval-after")  # harness.run.learning's folders, in the order they run
CAUSE_ORDER = ("ok", "model_failure", "timeout", "tampered", "infra_failure",
               "verifier_failure")


class JsonlTail:
    """An append-only JSONL file read incrementally: each call parses only the new lines.

    A line still being written (no trailing newline yet) is left for the next call; a line that
    is not JSON (a torn write after a crash) is counted in `bad_lines`, not fatal. A file that
    shrank (rewritten) is read again from the start."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict[str, Any]] = []
        self.bad_lines = 0
        self._offset = 0
        self._lock = threading.Lock()

    def read(self) -> list[dict[str, Any]]:
        with self._lock:
            try:
                size = self.path.stat().st_size
            except FileNotFoundError:
                return self.rows
            if size < self._offset:
                self.rows, self._offset, self.bad_lines = [], 0, 0
            if size == self._offset:
                return self.rows
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read(size - self._offset)
            end = chunk.rfind(b"\n") + 1
            for line in chunk[:end].splitlines():
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    self.bad_lines += 1
                    continue
                if isinstance(row, dict):
                    self.rows.append(row)
                else:
                    self.bad_lines += 1
            self._offset += end
            return self.rows


class Tokenizer:
    """Token id -> text with a `tokenizers` tokenizer.json (no transformers import: fast start)."""

    def __init__(self, path: Path, why: str):
        from tokenizers import Tokenizer as HFTokenizer

        self.path = path
        self.why = why
        self._tok = HFTokenizer.from_file(str(path))
        self._cache: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            # decode([id]) turns byte-level pieces into text; a piece that is half of a multi-byte
            # character decodes to U+FFFD, which the page shows as is (the id is in the tooltip).
            text = self._tok.decode([token_id], skip_special_tokens=False)
            if text == "" and (piece := self._tok.id_to_token(token_id)) is not None:
                text = piece
            self._cache[token_id] = text
        return text


def find_tokenizer(run_dir: Path, settings: dict[str, Any],
                   explicit: Path | None = None) -> tuple[Path | None, str]:
    """The run's tokenizer.json and why it was chosen, or (None, why not)."""
    if explicit is not None:
        path = explicit / "tokenizer.json" if explicit.is_dir() else explicit
        if not path.is_file():
            raise FileNotFoundError(f"--tokenizer {explicit}: no tokenizer.json there; pass a model "
                                    "directory or its tokenizer.json")
        return path, f"--tokenizer {explicit}"
    model = settings.get("model")
    if model and (Path(model).expanduser() / "tokenizer.json").is_file():
        return Path(model).expanduser() / "tokenizer.json", f"the run's model {model}"
    checkpoints = sorted((run_dir / "trainer").glob("checkpoint-*/model/tokenizer.json"),
                         key=lambda p: int(p.parent.parent.name.rsplit("-", 1)[1])
                         if p.parent.parent.name.rsplit("-", 1)[1].isdigit() else -1)
    if checkpoints:
        return checkpoints[-1], f"the run's checkpoint {checkpoints[-1].parent.parent.name}"
    if not model and settings:
        # The default tiny model is built per machine into the cache, keyed by its seed.
        from launchers.paths import cache_dir

        seed = settings.get("seed", 0)
        found = []
        for done in (cache_dir() / "models").glob("tiny-qwen3-*/.complete"):
            try:
                info = json.loads(done.read_text())
            except ValueError:
                continue
            if info.get("seed") == seed and (done.parent / "tokenizer.json").is_file():
                found.append(done.parent / "tokenizer.json")
        if found:
            newest = max(found, key=lambda p: p.stat().st_mtime)
            return newest, f"the tiny model built on this machine for seed {seed} ({newest.parent})"
    return None, "no tokenizer found (pass --tokenizer MODEL_DIR): tokens are shown as ids"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:  # a file being rewritten, or damaged: say so on the page
        return {"_unreadable": f"{path.name}: {exc}"}


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class RunData:
    """One run directory, read lazily and re-read as it grows (a live run)."""

    def __init__(self, run_dir: Path, tokenizer: Path | None = None, *,
                 parent: RunData | None = None):
        """`parent`: the run an eval side (eval-before/, eval-after/) belongs to; its settings
        and tokenizer are the side's (the side's folder has neither)."""
        self.dir = Path(run_dir)
        self.parent = parent
        self._sides: dict[str, RunData] = {}
        if not self.dir.is_dir():
            raise FileNotFoundError(f"run directory {self.dir} does not exist: pass the "
                                    "--output-dir of a harness.train or harness.eval run")
        self._rollouts = JsonlTail(self.dir / "rollouts.jsonl")
        self._metrics = JsonlTail(self.dir / "trainer" / "metrics.jsonl")
        self._groups = JsonlTail(self.dir / "trainer" / "groups.jsonl")
        self._explicit_tokenizer = tokenizer
        self._tokenizer: Tokenizer | None = None
        self._tokenizer_why: str | None = None
        self._lock = threading.Lock()

    # -- what is there ---------------------------------------------------------------------------
    def looks_like_a_run(self) -> bool:
        names = ("settings.json", "rollouts.jsonl", "rollouts", "summary.json",
                 "eval_summary.json", "trainer")
        return any((self.dir / n).exists() for n in names)

    def settings(self) -> dict[str, Any]:
        if self.parent is not None:
            return self.parent.settings()
        return _read_json(self.dir / "settings.json") or {}

    def kind(self) -> str:
        """"train" when a trainer wrote here, else "eval" (harness.eval, or an eval side)."""
        if self.parent is None and ((self.dir / "trainer").exists()
                                    or (self.dir / "summary.json").exists()):
            return "train"
        return "eval"

    # -- sides: the run's own rollouts, and its held-out evaluation before/after training -------
    def side_names(self) -> list[str]:
        """This run's own rollouts ("train", or "eval" for an eval run), then each eval side
        whose folder exists."""
        return [self.kind(), *(s for s in EVAL_SIDES if (self.dir / s).is_dir())]

    def side(self, name: str | None) -> RunData:
        """This run (None, "", "train" or "eval") or one of its eval sides, read like a run."""
        if not name or name == self.kind():
            return self
        if name not in EVAL_SIDES or not (self.dir / name).is_dir():
            raise KeyError(f"no side {name!r} in {self.dir}: its sides are "
                           f"{self.side_names()} (eval-before/ and eval-after/ are written by "
                           "harness.train --eval-tasks)")
        with self._lock:
            if name not in self._sides:
                self._sides[name] = RunData(self.dir / name, parent=self)
            return self._sides[name]

    def all_rollouts(self) -> list[dict[str, Any]]:
        """The index rows of every side, each with its `side` (indices repeat across sides)."""
        return [{**row, "side": name} for name in self.side_names()
                for row in self.side(name).rollouts()]

    def before_after(self) -> dict[str, Any] | None:
        """before_after.json (harness.run.learning), or None when the run has none."""
        return _read_json(self.dir / "before_after.json")

    def tokenizer(self) -> tuple[Tokenizer | None, str]:
        if self.parent is not None:
            return self.parent.tokenizer()
        with self._lock:
            if self._tokenizer is None:
                path, why = find_tokenizer(self.dir, self.settings(), self._explicit_tokenizer)
                if path is None:
                    return None, why  # looked again next time: a checkpoint may appear
                self._tokenizer, self._tokenizer_why = Tokenizer(path, why), why
            return self._tokenizer, self._tokenizer_why or ""

    # -- groups: advantage, reward parts, the step that trained each rollout ---------------------
    def _by_episode(self) -> tuple[dict[str, dict[str, Any]], dict[int, dict[str, Any]]]:
        by_episode: dict[str, dict[str, Any]] = {}
        by_group: dict[int, dict[str, Any]] = {}
        for group in self._groups.read():
            by_group[group.get("group_index")] = group
            for r in group.get("rollouts") or []:
                if r.get("episode_id") is not None:
                    by_episode[r["episode_id"]] = {**r, "step": group.get("step"),
                                                   "group_index": group.get("group_index"),
                                                   "group_skipped": group.get("skipped")}
        return by_episode, by_group

    # -- the index -------------------------------------------------------------------------------
    def rollouts(self) -> list[dict[str, Any]]:
        """One light row per rollout, joined with what the trainer did with it."""
        by_episode, _ = self._by_episode()
        rows = []
        for r in self._rollouts.read():
            g = by_episode.get(r.get("episode_id")) or {}
            rows.append({
                "index": r.get("index"), "task_id": r.get("task_id"), "seed": r.get("seed"),
                "episode_id": r.get("episode_id"), "cause": r.get("cause"),
                "env_reward": _finite(r.get("env_reward")), "reward": _finite(g.get("reward")),
                "advantage": _finite(g.get("advantage")), "step": g.get("step"),
                "group_skipped": g.get("group_skipped"), "finished_at": r.get("finished_at"),
                "attempts": r.get("attempts"), "error": (r.get("error") or "")[:200] or None,
                "seconds": _finite((r.get("timings") or {}).get("total")),
            })
        return rows

    def run(self) -> dict[str, Any]:
        """Everything the run page plots, computed from the index and the trainer's lines."""
        records = self._rollouts.read()
        metrics = self._metrics.read()
        by_episode, by_group = self._by_episode()
        summary = _read_json(self.dir / "summary.json")
        eval_summary = _read_json(self.dir / "eval_summary.json")
        kind = "train" if metrics or self.kind() == "train" else "eval"
        causes: dict[str, int] = {c: 0 for c in CAUSE_ORDER}
        for r in records:
            causes[str(r.get("cause"))] = causes.get(str(r.get("cause")), 0) + 1
        finished = sorted(t for r in records if (t := _finite(r.get("finished_at"))) is not None)
        per_minute: dict[str, list[float]] = {"minute": [], "rollouts": []}
        if finished:
            t0 = finished[0]
            counts: dict[int, int] = {}
            for t in finished:
                counts[int((t - t0) // 60)] = counts.get(int((t - t0) // 60), 0) + 1
            for m in range(max(counts) + 1):
                per_minute["minute"].append(float(m))
                per_minute["rollouts"].append(float(counts.get(m, 0)))
        phases: dict[str, list[float]] = {}
        for r in records:
            for phase, seconds in (r.get("timings") or {}).items():
                if (s := _finite(seconds)) is not None:
                    phases.setdefault(phase, []).append(s)
        skipped: dict[str, int] = {}
        for g in by_group.values():
            if g.get("skipped"):
                skipped[g["skipped"]] = skipped.get(g["skipped"], 0) + 1
        if not by_group:  # older runs: only the per-step metric counts
            for m in metrics:
                for k, v in m.items():
                    if k.startswith("groups/skipped/") and v:
                        skipped[k.split("/", 2)[2]] = skipped.get(k.split("/", 2)[2], 0) + int(v)
        return {
            "dir": str(self.dir.resolve()), "kind": kind, "settings": self.settings(),
            "summary": summary, "eval_summary": eval_summary, "n_rollouts": len(records),
            "bad_lines": {"rollouts.jsonl": self._rollouts.bad_lines,
                          "metrics.jsonl": self._metrics.bad_lines},
            "causes": {k: v for k, v in causes.items() if v or k in ("ok", "model_failure")},
            "metrics": _columns(metrics),
            "pass_rate_by_task": pass_rates(records),
            "pass_rate_by_step": _pass_rate_by_step(records, by_episode),
            "per_minute": per_minute,
            "rollout_phases": {k: sum(v) / len(v) for k, v in phases.items()},
            "groups_skipped": skipped,
            "groups_recorded": len(by_group),
            "before_after": self.before_after(),
            "sides": {name: len(self.side(name)._rollouts.read()) for name in self.side_names()},
        }

    # -- one rollout -----------------------------------------------------------------------------
    def rollout_file(self, index: int) -> Path:
        for r in self._rollouts.read():
            if r.get("index") == index and r.get("file"):
                return self.dir / "rollouts" / r["file"]
        matches = sorted((self.dir / "rollouts").glob(f"{index:05d}-*.json"))
        if not matches:
            raise KeyError(f"no rollout {index} in {self.dir}")
        return matches[0]

    def rollout(self, index: int) -> dict[str, Any]:
        from harness.view.turns import turns_view

        record = json.loads(self.rollout_file(index).read_text())
        trace = record.pop("trace", None) or {}
        by_episode, by_group = self._by_episode()
        trained = by_episode.get(record.get("episode_id"))
        group = by_group.get(trained["group_index"]) if trained else None
        tokenizer, why = self.tokenizer()
        return {
            **record,
            "trained": trained,
            "group": group,
            "trace_meta": {k: v for k, v in trace.items() if k != "turns"},
            "turns": turns_view(trace.get("turns") or [], tokenizer),
            "tokenizer": why,
        }

    def task_rollouts(self, task_id: str) -> list[dict[str, Any]]:
        return [r for r in self.rollouts() if r["task_id"] == task_id]


def pass_rates(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per task: passed / scored (unscored rollouts apart, never counted as fails)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        row = out.setdefault(str(r.get("task_id")), {"passed": 0, "scored": 0, "unscored": 0})
        reward = _finite(r.get("env_reward"))
        if reward is None:
            row["unscored"] += 1
        else:
            row["scored"] += 1
            row["passed"] += int(reward >= PASS_THRESHOLD)
    for row in out.values():
        row["rate"] = row["passed"] / row["scored"] if row["scored"] else None
    return dict(sorted(out.items()))


def _pass_rate_by_step(records: list[dict[str, Any]],
                       by_episode: dict[str, dict[str, Any]]) -> dict[str, list[Any]]:
    """The verifier pass rate of the rollouts each step trained on (from groups.jsonl)."""
    steps: dict[int, list[int]] = {}
    for r in records:
        g = by_episode.get(r.get("episode_id"))
        reward = _finite(r.get("env_reward"))
        if g is None or g.get("step") is None or reward is None:
            continue
        passed, scored = steps.setdefault(int(g["step"]), [0, 0])
        steps[int(g["step"])] = [passed + int(reward >= PASS_THRESHOLD), scored + 1]
    order = sorted(steps)
    return {"step": order, "rate": [steps[s][0] / steps[s][1] for s in order],
            "scored": [steps[s][1] for s in order]}


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Metric lines as columns (step, then every key seen), None where a step lacks a key."""
    keys: list[str] = []
    seen: set[str] = set()
    for row in rows:
        for k in row:
            if k not in seen:
                seen.add(k)
                keys.append(k)
    return {k: [_finite(row.get(k)) for row in rows] for k in keys}
