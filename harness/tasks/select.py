"""Pick a split out of loaded tasks: the first `count`, given `indices`, or given `names`.

Exactly one selector at a time (or none, for all tasks), so a config never means two things.
A name matches a task's short name or its full `org/name`. Unknown names and out-of-range
indices are all reported together, with what is available.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.tasks.errors import TaskSelectionError
from harness.tasks.loader import HarborTask
from harness.tasks.sources import load_source

__all__ = ["load_tasks", "select_tasks"]


def select_tasks(
    tasks: Sequence[HarborTask],
    *,
    count: int | None = None,
    indices: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
) -> list[HarborTask]:
    """The selected tasks, in the order asked for (names/indices) or loaded (count)."""
    given = [k for k, v in (("count", count), ("indices", indices), ("names", names)) if v]
    if len(given) > 1:
        raise TaskSelectionError(f"choose tasks by one of count, indices or names, not {given}")
    if not tasks:
        raise TaskSelectionError("no tasks to select from")
    if count is not None and count != 0:
        if count < 0 or count > len(tasks):
            raise TaskSelectionError(
                f"count={count} but {len(tasks)} task(s) are loaded: use 1..{len(tasks)}"
            )
        return list(tasks[:count])
    if indices:
        bad = [i for i in indices if not -len(tasks) <= i < len(tasks)]
        if bad:
            raise TaskSelectionError(
                f"indices {bad} are out of range for {len(tasks)} task(s) (0..{len(tasks) - 1})"
            )
        return [tasks[i] for i in indices]
    if names:
        by_name: dict[str, HarborTask] = {}
        for task in tasks:
            by_name[task.name] = task
            if task.full_name:
                by_name[task.full_name] = task
        missing = [n for n in names if n not in by_name]
        if missing:
            available = ", ".join(t.name for t in tasks)
            raise TaskSelectionError(f"unknown task name(s) {missing}; available: {available}")
        return [by_name[n] for n in names]
    return list(tasks)


def load_tasks(
    source: str = "bundled",
    *,
    count: int | None = None,
    indices: Sequence[int] | None = None,
    names: Sequence[str] | None = None,
    **source_kwargs: Any,
) -> list[HarborTask]:
    """Load a source (see `sources.load_source`) and select a split from it in one call."""
    return select_tasks(
        load_source(source, **source_kwargs), count=count, indices=indices, names=names
    )
