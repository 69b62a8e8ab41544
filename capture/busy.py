"""How long an engine was busy, as one proxy saw it: the time with at least one call in flight.

Why: the goal of a run's layout is that the engines, not the harness, bound throughput. The
question a run must answer is "were the engines waiting for us?", and the proxy is where every
engine call passes. Each `EngineClient` (capture.upstream) owns one `BusyClock`: `begin()` when a
chat completion is sent, `end()` when its reply was read or its stream released (a failed call
ends too). The clock keeps the busy intervals, merged (a new call while another is in flight
extends the interval), on the wall clock, so that the trainer can take the union of every
proxy's intervals for one engine (several rollout services share the engines) and divide by the
training time (harness.client.engine_busy).

What it does not measure: whether the engine was saturated. One call in flight counts as busy,
though a batching engine could have served many more at once; a fraction near 1 says the
harness kept the engine fed, not that the engine ran at full speed. Nor the engine's own queue:
a call waiting in vLLM's queue counts as busy here. Cost: two clock reads per call.

Wall clock (`time.time`), not monotonic: intervals from several hosts are compared, which
assumes their clocks agree (NTP: milliseconds, against calls of seconds). `keep` bounds memory;
a run with more busy intervals keeps the latest ones and says since when they are complete.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["BusyClock"]


class BusyClock:
    """Calls in flight to one engine, and the intervals during which there was at least one."""

    def __init__(self, clock: Callable[[], float] = time.time, keep: int = 4096) -> None:
        self.clock = clock
        self.in_flight = 0
        self.calls = 0  # calls begun
        self.busy_s = 0.0  # closed intervals only; report() adds the open one
        self.started = clock()  # intervals are complete from here ...
        self._since: float | None = None  # start of the open interval
        self._intervals: deque[tuple[float, float]] = deque(maxlen=keep)

    def begin(self) -> None:
        if self.in_flight == 0:
            self._since = self.clock()
        self.in_flight += 1
        self.calls += 1

    def end(self) -> None:
        if self.in_flight <= 0:  # an unmatched end is a bug upstream; never go negative
            return
        self.in_flight -= 1
        if self.in_flight == 0 and self._since is not None:
            now = self.clock()
            if len(self._intervals) == self._intervals.maxlen:
                self.started = self._intervals[0][1]  # ... or from the end of the one dropped
            self._intervals.append((self._since, now))
            self.busy_s += now - self._since
            self._since = None

    def report(self) -> dict[str, Any]:
        """JSON: calls, in flight, busy seconds, and the intervals [start, end] (the open one
        ends now), complete from `complete_since`."""
        now = self.clock()
        intervals = [list(i) for i in self._intervals]
        busy = self.busy_s
        if self._since is not None:
            intervals.append([self._since, now])
            busy += now - self._since
        return {"calls": self.calls, "in_flight": self.in_flight, "busy_s": busy,
                "complete_since": self.started, "now": now, "intervals": intervals}
