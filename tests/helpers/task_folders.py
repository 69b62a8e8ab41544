"""Checking a generated task family's folders: their bytes, and what Harbor's verifier gives them.

Shared by tests/test_task_family.py and tests/test_task_lookup.py, whose families are written by
the same code (harness/tasks/task_folder.py): a committed set is compared file by file (bytes and
the executable bit) with a fresh generation, and a task's real verifier is run by Harbor's Trial
in the local sandbox, with the reference solution or with a wrong answer in its place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from harness.service.sandboxes import environment_config


def folder_files(root: Path) -> dict[str, tuple[bytes, bool]]:
    """Every file under `root`: its bytes and whether its owner may execute it."""
    return {str(p.relative_to(root)): (p.read_bytes(), bool(p.stat().st_mode & 0o100))
            for p in sorted(root.rglob("*")) if p.is_file()}


async def trial_reward(task_dir: Path, trials: Path, agent: str = "oracle") -> float:
    """The reward the task's own verifier gives after `agent` ("oracle": the reference
    solution; "nop": nothing) ran in a local sandbox, through Harbor's Trial."""
    config = TrialConfig(task=TaskConfig(path=task_dir), trials_dir=trials,
                         trial_name=f"{agent}-{task_dir.name}", agent=AgentConfig(name=agent),
                         environment=environment_config("local"))
    result = await (await Trial.create(config)).run()
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    return result.verifier_result.rewards["reward"]


def with_solution(task_dir: Path, tmp_path: Path, solve: str) -> Path:
    """A copy of the task whose reference solution is `solve` (a bash script's body) instead."""
    copy = tmp_path / f"{task_dir.name}-variant"
    shutil.copytree(task_dir, copy)
    (copy / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")
    return copy
