"""Several engines behind one proxy: which engine serves a session's calls, and which are left.

`--engine-url a,b,...` gives the proxy several vLLM engines serving the same weights (one URL is
the single-engine proxy exactly as before). The pool answers one question per call,
`engine_for(session)`, and keeps the answer stable for the whole rollout.

Decisions:
  * Affinity by session. Every call of a rollout session goes to the engine that served its first
    call: each call's prompt extends the previous one, so the engine that holds the session's
    prefix in its cache prefills only the new tokens. Spreading calls instead would re-prefill a
    whole conversation (thousands of tokens for a real agent) on every engine switch.
  * Placement: a session's first call goes to the live engine with the fewest sessions pinned
    on it; ties go round the list (after the engine last chosen), so sessions that come one at a
    time (concurrency 1: each is deleted before the next starts) still take turns. Sessions,
    not calls in flight: an agent spends much of its rollout running tools between calls, so
    calls in flight undercount what an engine will be asked next. A session's pin is released
    when it is deleted (`release`).
  * Death. A connection refused (EngineUnreachable) takes an engine out at once; a dropped
    connection or a silent engine (EngineDisconnected, EngineTimeout: a single dropped socket
    is no proof) makes the pool probe its GET /health now; and every `health_interval_s` each
    live engine is probed anyway. A failed probe takes it out. Out is final: an engine restarted
    at the same address would serve its initial weights while the proxy stamps the trainer's
    current version, so a restarted engine needs a restarted run.
  * What a dead engine costs: the calls it had in flight fail (the agent gets a 502, the call is
    recorded as an infra failure, so its rollout is counted `infra_failure` by the harness's
    cause accounting); a session pinned to it with nothing in flight is moved at its next call
    (a cold prefix cache, nothing else). New sessions go to the others.
  * Retired (`retire`, from the trainer when its weight push to that engine failed): out, and
    its in-flight calls are cut (its client is closed) so that no call sampled from the older
    weights is recorded at the version stamped next (capture.app's /admin/weight_version
    retires before it stamps).
  * No engine left: every call fails at once with NoEngineLeft, which names each engine and why
    it left; the rollouts become infra failures and the trainer's weight push fails too
    (trainer.weight_sync.fanout), which stops the run with that message.
  * One engine: never taken out and never probed, so a refused call fails and the next one tries
    again, as the single-engine proxy always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from .errors import EngineDisconnected, EngineTimeout, EngineUnreachable, UpstreamError
from .upstream import EngineClient

__all__ = ["EnginePool", "NoEngineLeft", "split_engine_urls"]

logger = logging.getLogger(__name__)


def split_engine_urls(spec: str | list[str]) -> list[str]:
    """`"http://a:8000,http://b:8000/v1/"` -> the server roots, in order, duplicates refused."""
    parts = spec.split(",") if isinstance(spec, str) else list(spec)
    urls = [_root(p) for p in parts if p.strip()]
    if not urls:
        raise ValueError(f"no engine URL in {spec!r}: give --engine-url URL[,URL...]")
    if len(set(urls)) != len(urls):
        raise ValueError(f"an engine URL is listed twice in {spec!r}: each engine once")
    return urls


def _root(url: str) -> str:
    base = url.strip().rstrip("/")
    return base[:-3] if base.endswith("/v1") else base


class NoEngineLeft(EngineUnreachable):
    """Every engine of the pool is out: nothing can serve the call."""


@dataclass(eq=False)
class _Member:
    client: EngineClient
    sessions: int = 0  # sessions pinned here
    out: str | None = None  # why it left, None while live


class EnginePool:
    """The proxy's engines: `engine_for(session_id)` picks (and pins) one per session."""

    def __init__(self, engine_urls: str | list[str], *, timeout_s: float = 600.0,
                 health_interval_s: float = 5.0, health_timeout_s: float = 5.0) -> None:
        self.members = [_Member(EngineClient(url, timeout_s=timeout_s))
                        for url in split_engine_urls(engine_urls)]
        self.single = len(self.members) == 1
        if not self.single:
            for member in self.members:
                member.client.on_failure = self._on_failure
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self._pins: dict[str, _Member] = {}
        self._turn = 0  # where the search for the least-loaded engine starts (ties take turns)
        self._health: asyncio.Task[None] | None = None
        self._probing: set[asyncio.Task[None]] = set()

    @property
    def engine_url(self) -> str:
        return ",".join(m.client.engine_url for m in self.members)

    @property
    def live(self) -> list[str]:
        return [m.client.engine_url for m in self.members if m.out is None]

    def describe(self) -> list[dict[str, object]]:
        """Each engine's URL, pinned sessions, why it left (None: live), and its busy clock
        (capture.busy: calls, busy intervals), for the service's /metrics."""
        return [{"url": m.client.engine_url, "sessions": m.sessions, "out": m.out,
                 "busy": m.client.busy.report()} for m in self.members]

    # -- placement ------------------------------------------------------------------------------
    def engine_for(self, session_id: str) -> EngineClient:
        """The engine that serves this session's calls; raises NoEngineLeft when none is live."""
        if self.single:
            return self.members[0].client
        self._watch()
        member = self._pins.get(session_id)
        if member is not None and member.out is None:
            return member.client
        live = [m for m in self.members if m.out is None]
        if not live:
            raise NoEngineLeft("no engine left: " + "; ".join(
                f"{m.client.engine_url} {m.out}" for m in self.members))
        if member is not None:  # its engine left while the session had nothing in flight
            member.sessions -= 1
            logger.info("session %s moves from %s (out) to another engine", session_id,
                        member.client.engine_url)
        n = len(self.members)
        # min keeps the first of equals: the first counted from the engine after the last chosen
        chosen = min(live, key=lambda m: (m.sessions, (self.members.index(m) - self._turn) % n))
        self._turn = (self.members.index(chosen) + 1) % n
        chosen.sessions += 1
        self._pins[session_id] = chosen
        return chosen.client

    def release(self, session_id: str) -> None:
        """The session is gone: its pin no longer loads its engine."""
        member = self._pins.pop(session_id, None)
        if member is not None:
            member.sessions -= 1

    # -- death ----------------------------------------------------------------------------------
    def mark_out(self, url: str, why: str) -> bool:
        """Take the engine at `url` out (no new call goes to it); False if it is not in the
        pool or already out."""
        for member in self.members:
            if member.client.engine_url == _root(url) and member.out is None:
                member.out = why
                left = len(self.live)
                logger.warning("engine %s is out (%s); %d engine(s) left%s", url, why, left,
                               "" if left else ": every call now fails")
                return True
        return False

    async def retire(self, url: str) -> None:
        """Out, and its in-flight calls cut (module docstring). Unknown URLs: ValueError."""
        root = _root(url)
        member = next((m for m in self.members if m.client.engine_url == root), None)
        if member is None:
            raise ValueError(f"{url!r} is not one of this proxy's engines ({self.engine_url})")
        self.mark_out(root, "retired: the trainer's weight push to it failed")
        if not self.single:
            await member.client.aclose()

    def _on_failure(self, client: EngineClient, error: UpstreamError) -> None:
        if any(m.client is client and m.out is not None for m in self.members):
            return  # already out (a retired engine's cut calls land here): nothing to probe
        if isinstance(error, EngineUnreachable):
            self.mark_out(client.engine_url, f"refused a connection ({error.message[:200]})")
        elif isinstance(error, EngineDisconnected | EngineTimeout):
            task = asyncio.get_running_loop().create_task(self._probe(client))
            self._probing.add(task)
            task.add_done_callback(self._probing.discard)

    async def _probe(self, client: EngineClient) -> None:
        if not await client.healthy(self.health_timeout_s):
            self.mark_out(client.engine_url, "failed its health check")

    def _watch(self) -> None:
        """Start the periodic health check on the serving loop, at the first call."""
        if self._health is None or self._health.done():
            self._health = asyncio.get_running_loop().create_task(self._check_health())

    async def _check_health(self) -> None:
        while any(m.out is None for m in self.members):
            await asyncio.sleep(self.health_interval_s)
            live = [m for m in self.members if m.out is None]
            await asyncio.gather(*(self._probe(m.client) for m in live))

    async def aclose(self) -> None:
        for task in (self._health, *self._probing):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for member in self.members:
            await member.client.aclose()
