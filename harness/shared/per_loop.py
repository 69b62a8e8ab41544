"""`PerLoop`: one object per running event loop, for what asyncio binds to the loop it ran on.

Why it exists: an asyncio.Semaphore or an httpx.AsyncClient belongs to the event loop it first
ran on, and this project drives rollouts from several loops at once (the caller's loop for the
async API; a private loop per session for the sync API; asyncio.run per call for a remote
session's sync twins). The rollout service's factory and proxy link and the trainer's rollout
client each keep one such object per loop; this is the one map they share. It lives in
harness/shared so the trainer's side (harness.client) and the service's side (harness.service)
use it without either importing the other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["PerLoop"]


class PerLoop[T]:
    """`get()` is the running loop's object, made by `make()` on the loop's first call.

    `usable(obj)` False (a client closed by its user) makes a fresh one on the next `get()`.
    """

    def __init__(self, make: Callable[[], T], *, usable: Callable[[T], bool] | None = None) -> None:
        self._make = make
        self._usable = usable
        # id(loop) -> (loop, obj): the loop is kept so a recycled id can never hand a new loop an
        # object bound to a dead one.
        self._entries: dict[int, tuple[asyncio.AbstractEventLoop, T]] = {}

    def get(self) -> T:
        loop = asyncio.get_running_loop()
        entry = self._entries.get(id(loop))
        if entry is None or entry[0] is not loop or (
                self._usable is not None and not self._usable(entry[1])):
            # Nothing runs on a closed loop again: its objects are dropped here, so a process that
            # runs many short loops (a sync session each) does not keep them all.
            self._entries = {k: v for k, v in self._entries.items() if not v[0].is_closed()}
            entry = self._entries[id(loop)] = (loop, self._make())
        return entry[1]

    def pop(self) -> T | None:
        """The running loop's object, forgotten here (its caller closes it), or None."""
        entry = self._entries.pop(id(asyncio.get_running_loop()), None)
        return None if entry is None else entry[1]
