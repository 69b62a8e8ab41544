"""Asyncio plumbing for `harness.service.session`: cancel-and-wait, uncancellable awaits, a loop thread.

Why these exist: a session's close must finish even when the rollout awaiting it is cancelled
(cancelling 8 running rollouts must leave no process, sandbox or proxy session), and a session
driven through the sync API needs an event loop of its own that outlives each call.
`asyncio.shield` alone is not enough: it lets the *caller* return at once while the cleanup
still runs, so `uncancellable` waits for the cleanup and re-raises the cancel afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

__all__ = ["STOP_GRACE_S", "LoopThread", "cancel_and_wait", "uncancellable"]

log = logging.getLogger(__name__)

STOP_GRACE_S = 10.0  # how long a cancelled task may take to finish before we move on


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel a task and wait (bounded, never cancelling anything else) until it has finished."""
    task.cancel()
    await asyncio.wait({task}, timeout=STOP_GRACE_S)
    if not task.done():
        log.warning(
            "%r did not stop within %.0f s of its cancel; the sandbox stop kills it",
            task,
            STOP_GRACE_S,
        )


async def uncancellable(fut: asyncio.Future[Any]) -> Any:
    """Await `fut` to its end even if we are cancelled meanwhile; re-raise the cancel after."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(fut)
            break
        except asyncio.CancelledError:
            if fut.done():
                if fut.cancelled():
                    raise
                result = fut.result()
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


class LoopThread:
    """A private event loop on a daemon thread, for sessions driven through the sync API."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=STOP_GRACE_S)
        if not self._thread.is_alive():
            self.loop.close()
