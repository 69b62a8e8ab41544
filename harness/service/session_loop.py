"""Asyncio plumbing for `harness.service.session`: cancel-and-wait, uncancellable awaits, a loop
thread, and running a session's coroutine on that thread from a sync caller.

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
from collections.abc import Awaitable
from typing import Any

__all__ = ["STOP_GRACE_S", "LoopThread", "cancel_and_wait", "run_on", "uncancellable"]

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


def run_on[T](loop: asyncio.AbstractEventLoop | None, coro: Awaitable[T]) -> T:
    """`coro` run to its end on a session's `loop` (its loop thread), from a sync caller.

    From inside that loop the caller would wait on itself forever, so it raises instead."""
    if loop is None:
        raise RuntimeError(
            "session not started: use factory.create() or await factory.a_create()"
        )
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()  # type: ignore[attr-defined]
        raise RuntimeError(
            "sync session method called on the session's own loop; await its a_* twin"
        )
    return asyncio.run_coroutine_threadsafe(coro, loop).result()  # type: ignore[arg-type]
