"""The engine-busy fraction of a training run, from every rollout service's proxy.

Why: a run's throughput should be bound by its engines, not by the harness around them. If the
engines sit idle while the trainer waits for rollouts, the harness (sandboxes, agents, verifiers,
the proxy, the trainer's own step) is the bottleneck; if they are busy all the time, only more
or faster engines help. So summary.json reports, under `engine_busy`:

    engines[url].busy_fraction   the fraction of the training time (trainer.train(), from the
                                 first rollout to the last step; evaluations left out) during
                                 which at least one call was in flight to that engine from any
                                 proxy: the union of every service's busy intervals for it
                                 (capture.busy), clipped to the window, over the window
    engines[url].calls           engine calls sent to it (over the services' lifetimes)
    engines[url].by_service      the same fraction as each service's proxy alone saw it
    mean_busy_fraction           the mean over engines

"Busy" is "at least one call in flight", not "saturated": capture/busy.py says what that leaves
out. A service that cannot be asked at the end (down, killed) is listed under `unreachable`,
and its calls are missing from the union, so the fraction is then a lower bound. When a proxy
kept only its latest intervals (capture.busy's `keep`), the window starts where its intervals
are complete (`window_start` later than the training's start).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import httpx

__all__ = ["collect_engine_busy", "engine_busy", "union_s"]


def union_s(intervals: Iterable[Iterable[float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by at least one of `intervals` ([a, b] pairs)."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals)
    total, reach = 0.0, start
    for a, b in clipped:
        if b <= max(a, reach):  # outside the window, or already counted
            continue
        total += b - max(a, reach)
        reach = b
    return total


def engine_busy(metrics: Mapping[str, Mapping[str, Any]], start: float, end: float
                ) -> dict[str, Any]:
    """`metrics`: each service's GET /metrics (URL -> JSON), whose `engines` carry busy clocks.
    `start`, `end`: the training window on the wall clock (time.time())."""
    by_engine: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for service, answer in metrics.items():
        for engine in answer.get("engines") or []:
            if engine.get("busy") is not None:
                by_engine.setdefault(engine["url"], []).append((service, engine["busy"]))
    engines: dict[str, Any] = {}
    for url, clocks in by_engine.items():
        since = max([start, *(c["complete_since"] for _, c in clocks)])
        window = max(end - since, 0.0)
        everything = [i for _, c in clocks for i in c["intervals"]]
        engines[url] = {
            "busy_fraction": union_s(everything, since, end) / window if window else None,
            "calls": sum(c["calls"] for _, c in clocks),
            "by_service": {s: (union_s(c["intervals"], since, end) / window if window else None)
                           for s, c in clocks},
            "window_start": since,
        }
    fractions = [e["busy_fraction"] for e in engines.values() if e["busy_fraction"] is not None]
    return {"window_s": end - start, "engines": engines,
            "mean_busy_fraction": sum(fractions) / len(fractions) if fractions else None}


def collect_engine_busy(pool: Any, start: float, end: float) -> dict[str, Any]:
    """Ask every service of `pool` (a ServicePool) for its /metrics and compute `engine_busy`.
    Never raises for a service that does not answer: it is listed under `unreachable`."""
    metrics: dict[str, Mapping[str, Any]] = {}
    unreachable: dict[str, str] = {}
    for service in pool.services:
        try:
            response = pool.client.get(f"{service.url}/metrics",
                                       timeout=httpx.Timeout(10.0, connect=2.0))
            response.raise_for_status()
            metrics[service.url] = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            unreachable[service.url] = f"{type(exc).__name__}: {exc}"
    return {**engine_busy(metrics, start, end), "unreachable": unreachable}
