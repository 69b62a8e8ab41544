"""Threads that call into torch's C++ on a peer's behalf, kept out of the way of process exit.

Python 3.12 ends a daemon thread with `pthread_exit` the moment it retakes the GIL after the
interpreter began to finalize. If that moment is the return of a torch C++ call that released the
GIL (a gloo collective's `wait()`, a store operation, a store's or gloo's constructor), the unwind
crosses pybind11's GIL guard and calls `std::terminate`: the process dies with SIGABRT (exit 134)
after its work is done. Measured: a test process whose shutdown outlasted a blocked gloo join's
30 s timeout by a few seconds died that way after all 1,457 tests had passed; with a shutdown held
open past a 4 s group timeout, a script that failed a push or a group's set-up and then exited
died that way in 11 runs of 12 (0 of 12 with this module); one of them was still in the store's
constructor, not waiting at all, when the process began to exit.

So the weight sync's threads run such calls `guarded()`, and wait on peers with `poll_until`,
which sleeps in Python between quick checks. An `atexit` hook (it runs before daemon threads are
frozen) makes every poll stop with `ProcessExiting` and waits a moment until no thread is inside
a guarded section. What this does not cover: a section still inside one long C++ call after that
moment (gloo's constructor when a peer died after joining); it ends at the group's timeout, or
aborts as before.

Stdlib only: the vLLM workers import it from the engine venv.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["ProcessExiting", "guarded", "poll_until"]

# The first checks are near-immediate (a 64 MiB chunk crosses loopback in tens of ms), then at
# most one wake-up per millisecond, which costs nothing next to the copy itself.
_FIRST_STEP_S = 0.0001
_MAX_STEP_S = 0.001
# How long exit waits for the guarded sections to leave: a poll leaves within one step, a store
# round trip or a chunk's copy within milliseconds.
_EXIT_GRACE_S = 2.0

_exiting = threading.Event()
_inside = 0
_inside_changed = threading.Condition()


class ProcessExiting(RuntimeError):
    """The interpreter is shutting down; a wait on a peer stopped instead of finishing."""


def _raise_if_exiting() -> None:
    if _exiting.is_set():
        raise ProcessExiting("the process is exiting; stopped waiting for a weight-sync peer")


@contextmanager
def guarded() -> Iterator[None]:
    """Count this thread as inside torch's C++ for a peer until the block ends."""
    global _inside
    with _inside_changed:
        _raise_if_exiting()
        _inside += 1
    try:
        yield
    finally:
        with _inside_changed:
            _inside -= 1
            _inside_changed.notify_all()


def poll_until(done: Callable[[], bool], timeout_s: float | None = None) -> bool:
    """Call `done` until it is True (returns True) or `timeout_s` passes (returns False).

    `done` must return quickly; in between, this thread sleeps in Python, where exit can end it
    safely. Raises `ProcessExiting` once the process starts to exit.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    step = _FIRST_STEP_S
    while True:
        _raise_if_exiting()
        if done():
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(step)
        step = min(step * 2, _MAX_STEP_S)


def _wait_for_guarded_sections_at_exit() -> None:
    _exiting.set()
    with _inside_changed:
        _inside_changed.wait_for(lambda: _inside == 0, timeout=_EXIT_GRACE_S)


atexit.register(_wait_for_guarded_sections_at_exit)
