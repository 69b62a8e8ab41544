"""Learning-bench run folders as harness.train and harness.eval leave them, written here (the
bench's runs take hours): shared by the bench's statistics, schedule and ledger tests."""

from __future__ import annotations

import json
from pathlib import Path

# The bench's SGD setting, as flags after `--`.
SGD = ["--optimizer", "sgd", "--learning-rate", "0.25", "--max-staleness", "0"]
INSTRUCTIONS = [f"{s}-{t}-t{k}" for s, t in (("key", "answer"), ("value", "out")) for k in range(3)]


def before_after(changes: dict[str, tuple[int, int]], n: int = 8) -> dict:
    """A before_after.json with per-instruction rows: {instruction: (passed before, after)}."""
    return {"per_task": {i: {"before": {"passed": b, "scored": n}, "after": {"passed": a,
                                                                          "scored": n}}
                         for i, (b, a) in changes.items()},
            "before_pass_rate": 0.1, "after_pass_rate": 0.4, "change_points": 30.0, "seed": 0}


def record(task: str, reward: float | None, *commands: str) -> dict:
    """A lookup rollout's record whose turns ran these bash commands."""
    turns = [{"response": {"choices": [{"message": {"tool_calls": [{"function": {
        "arguments": json.dumps({"command": c})}}]}}]}} for c in commands]
    return {"task_id": f"harness-lookup/{task}", "env_reward": reward, "trace": {"turns": turns}}


def finished(folder: Path, command: list[str], **changed) -> None:
    """A finished run's folder as harness.train leaves it: its settings as train.py records them
    (vars(settings) through json, default=str) and a before_after.json."""
    from harness.shared.run_config import build_parser, settings_from_args

    settings = vars(settings_from_args(build_parser("t", ""), command[3:]))
    folder.mkdir(parents=True)
    (folder / "settings.json").write_text(json.dumps({**settings, **changed}, default=str))
    (folder / "before_after.json").write_text(json.dumps(
        {"per_task": {}, "before_pass_rate": 0.3, "after_pass_rate": 0.8,
         "change_points": 50.0, "seed": 0}))
