"""Which old checkpoints to delete after a save: the oldest by write order, never the new one.

Why its own module: pruning used to sort `checkpoint-<step>` folders by step number and keep the
highest. A folder that already held an earlier run's `checkpoint-11` and `-12` then lost a new
run's `checkpoint-1` the moment it was saved, and `latest` named a deleted folder. Step numbers
order checkpoints within one run only; the order they were written in orders them across runs
(harness.shared.run_dir now refuses to start in such a folder without --resume or --overwrite, but a
resumed run, or a trainer used from Python, can still meet an earlier run's checkpoints).

Write order is the modification time of `trainer_state.pt`, the last file a save writes before
its folder is renamed into place (trainer/checkpoint.py); the step number breaks ties within one
clock tick. The checkpoint just written is kept whatever the clock says.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

__all__ = ["checkpoints_by_write_order", "prune_checkpoints"]

log = logging.getLogger(__name__)


def _step(path: Path) -> int:
    try:
        return int(path.name.split("-", 1)[1])
    except (IndexError, ValueError):
        return -1


def checkpoints_by_write_order(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest written first (`.tmp` saves in progress left out)."""
    def written(path: Path) -> tuple[int, int]:
        state = path / "trainer_state.pt"
        return (state.stat().st_mtime_ns if state.exists() else path.stat().st_mtime_ns, _step(path))

    found = [p for p in root.glob("checkpoint-*") if p.is_dir() and p.suffix != ".tmp"]
    return sorted(found, key=written)


def prune_checkpoints(root: Path, total_limit: int, *, keep: Path) -> list[Path]:
    """Delete all but the `total_limit` most recently written checkpoints; `keep` (the one just
    written, which `latest` names) is never deleted. Returns the deleted folders."""
    olds = [p for p in checkpoints_by_write_order(root) if p.resolve() != keep.resolve()]
    doomed = olds[:max(len(olds) - (max(total_limit, 1) - 1), 0)]
    for old in doomed:
        log.info("deleting checkpoint %s (save_total_limit %d)", old, total_limit)
        shutil.rmtree(old, ignore_errors=True)
    return doomed
