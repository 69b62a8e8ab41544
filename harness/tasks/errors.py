"""What can go wrong when loading tasks, as one tree. Every message names the fix.

TaskError
├── TaskNotFoundError            a path or task name that does not exist
├── TaskDefinitionError          a task dir Harbor cannot run (lists every problem at once)
├── TaskSourceError              a source spec that cannot be read or holds no task
│   └── TaskSourceUnavailableError   the registry or hub could not be reached
└── TaskSelectionError           count / indices / names that do not fit the tasks
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "TaskDefinitionError",
    "TaskError",
    "TaskNotFoundError",
    "TaskSelectionError",
    "TaskSourceError",
    "TaskSourceUnavailableError",
]


class TaskError(Exception):
    """Base of every task-loading failure."""


class TaskNotFoundError(TaskError, FileNotFoundError):
    """A task path or name that does not exist."""


class TaskDefinitionError(TaskError):
    """A task directory that Harbor could not run; `problems` lists each fix."""

    def __init__(self, task_dir: Path, problems: list[str]):
        self.task_dir = task_dir
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"task {task_dir} is not a valid Harbor task:\n{lines}")


class TaskSourceError(TaskError):
    """A task source (folder, registry dataset, HF repo) that yields no usable task."""


class TaskSourceUnavailableError(TaskSourceError):
    """The registry or hub holding the tasks could not be reached."""


class TaskSelectionError(TaskError):
    """A selection (count, indices, names) that does not fit the loaded tasks."""
