"""Wait, with a deadline, for the processes a run was told to use (--engine-url, --rollout-service).

Why this exists: the GPU quick start starts the engine and the rollout service in the
background and the trainer at once. The trainer's pre-start check used to make one 5 s
`/health` request, so it stopped with "not a healthy vLLM server" while a 4B model was still
loading (minutes). Now the check polls each URL's `/health` until it answers 200 or
`--ready-timeout-s` passes (default 600 s), and says on the console what it waits on and why the
last try failed, every `report_every_s`, so a wait is never silent and never endless.

A process that is not listening yet (connection refused), one that answers 503 while it loads,
and one that does not answer in time all count as "not ready yet". Only the deadline turns them
into a problem, which then names the URL, the last failure and the flag to raise.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

__all__ = ["Target", "wait_ready"]


@dataclass(frozen=True)
class Target:
    """One process to wait for: the flag that named it, its base URL, and what it is."""

    flag: str  # e.g. "--engine-url"
    url: str
    what: str  # e.g. "the vLLM engine"
    path: str = "/health"

    @property
    def health_url(self) -> str:
        return self.url.rstrip("/") + self.path


def _probe(target: Target, timeout_s: float) -> str | None:
    """None when `target` answers 200, else why not (for the waiting message)."""
    try:
        reply = httpx.get(target.health_url, timeout=timeout_s)
    except httpx.ConnectError:
        return "connection refused (not listening yet)"
    except httpx.TimeoutException:
        return f"no answer within {timeout_s:.0f} s"
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if reply.status_code == 200:
        return None
    return f"HTTP {reply.status_code} ({reply.text[:120].strip()!r})"


def wait_ready(targets: list[Target], timeout_s: float, *, poll_s: float = 1.0,
               report_every_s: float = 15.0, probe_timeout_s: float = 5.0,
               say: Callable[[str], None] | None = None) -> list[str]:
    """Poll every target's health URL until all answer 200 or `timeout_s` passes.

    Returns one problem per target still not ready at the deadline ([] when all are). `say`
    (default: stderr) hears what is awaited when the first try fails and every
    `report_every_s` after that, each with the time left and the last failure.
    """
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    start = time.monotonic()
    deadline = start + timeout_s
    pending = {t: "not tried" for t in targets}
    next_report = start
    while True:
        for target in list(pending):
            why = _probe(target, min(probe_timeout_s, max(deadline - time.monotonic(), 0.1)))
            if why is None:
                if pending[target] != "not tried":
                    say(f"ready: {target.what} at {target.url} "
                        f"(after {time.monotonic() - start:.0f} s)")
                del pending[target]
            else:
                pending[target] = why
        now = time.monotonic()
        if not pending:
            return []
        if now >= deadline:
            return [f"{t.flag} {t.url}: {t.what} did not answer GET {t.path} within "
                    f"{timeout_s:.0f} s (last: {why}); start it first, check its log, or wait "
                    f"longer with --ready-timeout-s" for t, why in pending.items()]
        if now >= next_report:
            for t, why in pending.items():
                say(f"waiting for {t.what} at {t.url} to answer GET {t.path} "
                    f"({deadline - now:.0f} s left of --ready-timeout-s {timeout_s:.0f}; "
                    f"last: {why})")
            next_report = now + report_every_s
        time.sleep(min(poll_s, max(deadline - now, 0.0)))
