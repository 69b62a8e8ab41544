"""`ServicePool`: the rollout services one trainer uses, their load as it sees it, and its HTTP clients.

Why it exists: the transport under both of the client's seams (whole rollouts and sessions). It
picks the least-loaded service, remembers which answered 429 (until its Retry-After) or refused
a connection (for `down_s`), tells every service the engine's weight version, and keeps the
httpx clients: one sync client, and one async client per event loop (harness.shared.per_loop).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from harness.client.remote_errors import error_of
from harness.client.spawn import KEY_ENV
from harness.shared.per_loop import PerLoop

__all__ = ["DROPPED", "POLL_S", "Service", "ServicePool"]

log = logging.getLogger(__name__)
POLL_S = 20.0  # one long poll; the HTTP read timeout is this plus a margin
# A connection that broke under a request, not one that never opened or timed out: a request
# sent on a keep-alive connection just as the other end closed it, or a reset on the way. Such a
# request is sent once more at once, on a new connection (`ServicePool.resend_once`), before the
# service is taken for down: a service is not avoided for `down_s`, and a rollout it is running
# well not written off as lost, for one connection's accident.
DROPPED: tuple[type[httpx.TransportError], ...] = (httpx.ReadError, httpx.WriteError,
                                                   httpx.RemoteProtocolError)


class Service:
    """One service as this client sees it: its rollouts in flight from here, when it may be asked
    again, and the rollouts lost with it."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.in_flight = 0
        self.busy_until = 0.0  # a 429's Retry-After
        self.down_until = 0.0  # refused a connection
        self.lost = 0  # rollouts lost with it


class ServicePool:
    """The services one trainer uses, their load as this client sees it, and the HTTP clients."""

    def __init__(self, urls: str | list[str], key: str | None = None, *,
                 connect_timeout_s: float = 5.0, request_timeout_s: float = 60.0,
                 down_s: float = 30.0) -> None:
        urls = [urls] if isinstance(urls, str) else list(urls)
        key = key or os.environ.get(KEY_ENV)
        problems = []
        if not urls:
            problems.append("give at least one rollout service URL")
        problems += [f"{u!r} is not an http(s) URL" for u in urls
                     if not str(u).startswith(("http://", "https://"))]
        if not key:
            problems.append(f"the services' key is missing (key= or ${KEY_ENV}; "
                            "python -m harness.serve prints it)")
        if problems:
            raise ValueError("rollout services: " + "; ".join(problems))
        self.services = [Service(u) for u in urls]
        self.key = key
        self.down_s = down_s
        self.timeout = httpx.Timeout(request_timeout_s, connect=connect_timeout_s)
        self._headers = {"Authorization": f"Bearer {key}"}
        self._sync = httpx.Client(headers=self._headers, timeout=self.timeout, trust_env=False)
        self._async = PerLoop(self._new_aclient, usable=lambda c: not c.is_closed)
        self._lock = threading.Lock()
        # The engine's weight version as last told: sent with every new rollout and session too,
        # so a service that missed an update (down, restarted) stamps the right version anyway.
        self.weight_version: int | None = None
        self.weight_model: str | None = None  # the LoRA adapter serving it (None: the base)
        self.resent = 0  # requests sent again after their connection dropped (DROPPED)

    def aclient(self) -> httpx.AsyncClient:
        return self._async.get()

    def _new_aclient(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(headers=self._headers, timeout=self.timeout, trust_env=False)

    @property
    def client(self) -> httpx.Client:
        return self._sync

    def pick(self) -> tuple[Service | None, float]:
        """The least-loaded service open now, or (None, seconds until one may be)."""
        now = time.monotonic()
        with self._lock:
            open_ = [s for s in self.services if s.busy_until <= now and s.down_until <= now]
            if open_:
                chosen = min(open_, key=lambda s: (s.in_flight, random.random()))
                chosen.in_flight += 1
                return chosen, 0.0
            wake = min(max(s.busy_until, s.down_until) for s in self.services)
            return None, max(0.05, wake - now)

    async def resend_once(self, send: Callable[[], Awaitable[httpx.Response]]
                          ) -> httpx.Response:
        """`await send()`, and once more when its connection dropped (DROPPED). Only for a
        request that is safe to repeat: a GET, a long poll, a session's verify (the service
        grades a session once), a weight version (set exactly), a POST carrying a request_id
        (the service answers a repeat with the rollout or session the first one started)."""
        try:
            return await send()
        except DROPPED as exc:
            self._count_resent(exc)
            return await send()

    def resend_once_sync(self, send: Callable[[], httpx.Response]) -> httpx.Response:
        """`resend_once` for the sync client."""
        try:
            return send()
        except DROPPED as exc:
            self._count_resent(exc)
            return send()

    def _count_resent(self, exc: httpx.TransportError) -> None:
        with self._lock:
            self.resent += 1
        log.info("connection dropped under a request (%s: %s); sending it again",
                 type(exc).__name__, exc)

    def release(self, service: Service) -> None:
        with self._lock:
            service.in_flight -= 1

    def mark_busy(self, service: Service, response: httpx.Response) -> None:
        try:
            wait = float(response.headers.get("retry-after", "1"))
        except ValueError:
            wait = 1.0
        service.busy_until = time.monotonic() + max(0.05, wait)

    def mark_down(self, service: Service, exc: BaseException) -> None:
        log.warning("rollout service %s unreachable (%s: %s); avoiding it for %.0f s",
                    service.url, type(exc).__name__, exc, self.down_s)
        service.down_until = time.monotonic() + self.down_s

    def set_weight_version(self, version: int, model: str | None = None, *,
                           retired: list[str] | None = None) -> None:
        """Tell every service's capture proxy the engines' weights changed (a dead one: logged;
        it hears the version with its next rollout). `model`: the engine model name serving
        `version` when it is a LoRA adapter (trainer/weight_sync/lora.py); None: the base.
        `retired`: engines whose weight push failed, which each proxy takes out before it stamps
        `version` (capture.engines). A service down at that moment misses the retirement (it
        later hears only the version): restart it."""
        self.weight_version, self.weight_model = version, model
        body: dict[str, Any] = {"version": version, "model": model,
                                **({"retired": retired} if retired else {})}
        for s in self.services:
            try:
                # It sets the version exactly: safe to send again when its connection dropped
                # (else a service that is up would be avoided for down_s and miss `retired`).
                r = self.resend_once_sync(lambda url=s.url: self._sync.post(
                    f"{url}/v1/weight_version", json=body,
                    timeout=httpx.Timeout(10.0, connect=2.0)))
                r.raise_for_status()
            except httpx.HTTPError as exc:
                self.mark_down(s, exc)

    def metrics(self) -> dict[str, Any]:
        return {s.url: {"in_flight": s.in_flight, "lost": s.lost} for s in self.services}

    def tasks(self, split: Any, task_count: int | None = None) -> dict[str, list[str] | str]:
        """Each service's task names for `split` (seed order), or why it cannot load it."""
        answers: dict[str, list[str] | str] = {}
        for s in self.services:
            try:
                # A registry or hub split may download on first load: a long read timeout.
                r = self._sync.post(f"{s.url}/v1/tasks",
                                    json={"split": split, "task_count": task_count},
                                    timeout=httpx.Timeout(900.0, connect=5.0))
            except httpx.HTTPError as exc:
                answers[s.url] = f"not answering ({type(exc).__name__}: {exc})"
                continue
            if r.status_code == 200:
                answers[s.url] = list(r.json()["tasks"])
            else:
                answers[s.url] = str(error_of(r).get("message") or f"HTTP {r.status_code}")
        return answers

    def close(self) -> None:
        self._sync.close()

    async def aclose_loop(self) -> None:
        """Close the async client of the running event loop (each loop has its own)."""
        client = self._async.pop()
        if client is not None:
            await client.aclose()

    async def aclose(self) -> None:
        await self.aclose_loop()
        self.close()
