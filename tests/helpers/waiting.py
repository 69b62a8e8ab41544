"""Waiting in tests: on a condition, with a generous deadline that says what was awaited.

Why: a fixed window ("sleep 0.5 s and look", "poll 400 times") that a quiet machine meets is
missed by a loaded one. Issue 14: with the suite running beside another, 7 of 8 rollouts were
running at the end of a 20 s window that a quiet 2-core machine always met. A condition costs
nothing when it holds early, so the deadline can be minutes; when it is exceeded, the error names
the condition and, with `state`, what was seen last, instead of a bare `assert False`.

    wait_until(lambda: path.exists(), f"{path} to be written")
    await until(lambda: running() >= 8, "all eight agents running", state=lambda: running())
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["GENEROUS_S", "until", "wait_until"]

GENEROUS_S = 180.0  # far above any wait here on a quiet machine (seconds), well under pytest's 900


def _timed_out(what: str, timeout_s: float, state: Callable[[], Any] | None) -> AssertionError:
    seen = f"; last seen: {state()!r}" if state is not None else ""
    return AssertionError(f"waited {timeout_s:g} s for {what}, and it did not happen{seen}")


def wait_until[T](condition: Callable[[], T], what: str, *, timeout_s: float = GENEROUS_S,
               interval_s: float = 0.05, state: Callable[[], Any] | None = None) -> T:
    """Poll `condition()` until it is truthy and return its value; AssertionError naming `what`
    (and `state()`) if `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, state)
        time.sleep(interval_s)


async def until[T](condition: Callable[[], T | Awaitable[T]], what: str, *,
                timeout_s: float = GENEROUS_S, interval_s: float = 0.05,
                state: Callable[[], Any] | None = None) -> T:
    """`wait_until` for a coroutine: sleeps on the event loop between polls. `condition` may
    be a coroutine function (a check that itself awaits, e.g. a command in a sandbox)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout_s, state)
        await asyncio.sleep(interval_s)
