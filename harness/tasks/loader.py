"""Load Harbor task directories from a local folder, with errors that say what to fix.

A Harbor task directory (Harbor's `Task` docstring has the full layout):

    instruction.md   the prompt the agent gets
    task.toml        timeouts, resources, verifier/agent settings (schema_version "1.4")
    environment/     Dockerfile (the local sandbox honours WORKDIR, COPY, ENV, RUN) + files
    tests/test.sh    run after the agent; writes /logs/verifier/reward.txt or reward.json
    solution/solve.sh  optional reference solution (Harbor's oracle agent runs it)

Harbor's own `Task` class parses and validates; this module checks the common mistakes first so
the error lists every problem at once with its fix, instead of the first exception Harbor hits.
It does not copy, download or modify tasks.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.tasks.errors import TaskDefinitionError, TaskNotFoundError, TaskSourceError

if TYPE_CHECKING:
    from harbor.models.task.task import Task

__all__ = ["BUNDLED_DIR", "HarborTask", "bundled_tasks", "load_folder", "load_task", "quiet_harbor"]

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


@dataclass(frozen=True)
class HarborTask:
    """One validated task: where it lives, where it came from, and its prompt.

    `name` is the task's short name (the [task] name without its org, else the directory name);
    `source` says where it was loaded from ("bundled", "local:DIR", "registry:NAME@VER",
    "hf:REPO@REV"), for logs and metrics.
    """

    name: str
    path: Path
    source: str
    instruction: str
    full_name: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def harbor(self) -> Task:
        """Harbor's `Task` for this directory (what Trial, Verifier and agents take)."""
        from harbor.models.task.task import Task

        return Task(self.path)

    @property
    def has_solution(self) -> bool:
        return (self.path / "solution" / "solve.sh").exists()

    def __str__(self) -> str:
        return f"{self.name} ({self.source})"


def _precheck(task_dir: Path) -> list[str]:
    """The common mistakes, each with its fix; empty when Harbor should accept the dir."""
    problems: list[str] = []
    toml_path = task_dir / "task.toml"
    config: dict[str, Any] = {}
    if not toml_path.exists():
        problems.append('missing task.toml: add one (at least `schema_version = "1.4"`)')
    else:
        try:
            config = tomllib.loads(toml_path.read_text())
        except tomllib.TOMLDecodeError as exc:
            problems.append(f"task.toml is not valid TOML ({exc}): fix the syntax")
    has_steps = bool(config.get("steps"))
    if not has_steps and not (task_dir / "instruction.md").exists():
        problems.append("missing instruction.md: write the agent's prompt there")
    tests = task_dir / "tests"
    if not has_steps and not (tests / "test.sh").exists():
        problems.append(
            "missing tests/test.sh: the verifier runs it after the agent and it must write "
            "/logs/verifier/reward.txt (one number) or /logs/verifier/reward.json ({key: number})"
        )
    docker_image = (config.get("environment") or {}).get("docker_image")
    if not (task_dir / "environment").is_dir() and not docker_image:
        problems.append(
            "missing environment/: add environment/Dockerfile (e.g. `FROM ubuntu:24.04` and "
            "`WORKDIR /app`) or set [environment].docker_image in task.toml"
        )
    return problems


def load_task(path: str | Path, *, source: str | None = None) -> HarborTask:
    """Validate one task directory and describe it; TaskDefinitionError lists what to fix."""
    task_dir = Path(path).expanduser().resolve()
    if not task_dir.is_dir():
        raise TaskNotFoundError(f"task directory {task_dir} does not exist")
    problems = _precheck(task_dir)
    if problems:
        raise TaskDefinitionError(task_dir, problems)
    from harbor.models.task.task import Task

    try:
        task = Task(task_dir)
    except (ValueError, OSError, RuntimeError) as exc:
        # Harbor's pydantic errors already name the field; keep them whole.
        raise TaskDefinitionError(task_dir, [f"Harbor rejected it: {exc}"]) from exc
    full_name = task.config.task.name if task.config.task is not None else None
    return HarborTask(
        name=task.short_name,
        path=task_dir,
        source=source or f"local:{task_dir}",
        instruction=task.instruction,
        full_name=full_name,
        metadata=dict(task.config.metadata),
    )


def load_folder(folder: str | Path, *, source: str | None = None) -> list[HarborTask]:
    """Every task in `folder` (or `folder` itself if it is one), sorted by name.

    All broken tasks are reported together, so one run shows every fix needed.
    """
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise TaskNotFoundError(f"task folder {root} does not exist")
    if (root / "task.toml").exists() or (root / "instruction.md").exists():
        return [load_task(root, source=source)]
    candidates = sorted(
        p
        for p in root.iterdir()
        if p.is_dir() and ((p / "task.toml").exists() or (p / "instruction.md").exists())
    )
    if not candidates:
        raise TaskSourceError(
            f"no task directories in {root}: expected subfolders holding task.toml and "
            "instruction.md (see harness/tasks/bundled/ for examples)"
        )
    tasks: list[HarborTask] = []
    errors: list[TaskDefinitionError] = []
    for candidate in candidates:
        try:
            tasks.append(load_task(candidate, source=source))
        except TaskDefinitionError as exc:
            errors.append(exc)
    if errors:
        problems = [f"{e.task_dir.name}: {p}" for e in errors for p in e.problems]
        raise TaskDefinitionError(root, problems)
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TaskSourceError(
            f"{root} holds several tasks named {dupes}: task names must be unique"
        )
    return sorted(tasks, key=lambda t: t.name)


def bundled_tasks() -> list[HarborTask]:
    """The small offline tasks shipped in harness/tasks/bundled/ (each with a solution)."""
    return load_folder(BUNDLED_DIR, source="bundled")


def quiet_harbor() -> None:
    """Harbor sets its root logger to DEBUG at import; a rollout process's console shows warnings
    and up. Called first by the commands whose process loads tasks (serve, eval, audit)."""
    import logging

    from harbor.utils.logger import logger as harbor_logger

    harbor_logger.setLevel(logging.WARNING)
