"""`RemoteSession`: one session on a rollout service, OpenEnv's TrainableSession surface over HTTP.

Why it exists: TRL's `HarnessRolloutWorker` and trainer/'s `SessionDriver` drive a session
through wait_for_completion / fetch_training_trace / verify / close (and async twins); this is
that surface for a session that runs on a service, its transport failures raised as
ServiceLostError and the service's own failures as the class it named (remote_errors).
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import httpx

from harness.client.remote_errors import ServiceLostError, error_of, raise_remote
from harness.client.remote_results import JsonTrace
from harness.client.service_pool import POLL_S, Service, ServicePool
from harness.shared.errors import InfraError

__all__ = ["RemoteSession"]

log = logging.getLogger(__name__)


class RemoteSession:
    """One session on a service; OpenEnv's TrainableSession surface over HTTP (sync + async)."""

    def __init__(self, pool: ServicePool, service: Service, sid: str, task_id: str) -> None:
        self.pool = pool
        self.service = service
        self.url = f"{service.url}/v1/sessions/{sid}"
        self.task_id = task_id
        self.timed_out = False
        self._closed = False

    # sync twins: each is the async one on a private loop (httpx's sync client would need a
    # second copy of every error path).
    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        return asyncio.run(self._with_loop(self.a_wait_for_completion(timeout_s)))

    def fetch_training_trace(self) -> JsonTrace:
        return asyncio.run(self._with_loop(self.a_fetch_training_trace()))

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        return self.fetch_training_trace().to_trace_entries()

    def verify(self, transcript: list[dict[str, Any]] | None = None,
               final_state: Any = None) -> SimpleNamespace:
        return asyncio.run(self._with_loop(self.a_verify(transcript, final_state)))

    def close(self) -> None:
        asyncio.run(self._with_loop(self.a_close()))

    async def _with_loop(self, coro: Any) -> Any:
        try:
            return await coro
        finally:
            await self.pool.aclose_loop()

    async def a_wait_for_completion(self, timeout_s: float | None = None) -> int:
        while True:
            body = await self._call("POST", "/wait", json={"timeout_s": timeout_s,
                                                           "wait_s": POLL_S})
            if body.get("done"):
                self.timed_out = bool(body.get("timed_out"))
                return int(body["exit_code"])

    async def a_fetch_training_trace(self) -> JsonTrace:
        body = await self._call("GET", "/trace")
        return JsonTrace(body["trace"], body.get("entries"))

    async def a_verify(self, transcript: list[dict[str, Any]] | None = None,
                       final_state: Any = None) -> SimpleNamespace:
        body = await self._call("POST", "/verify", json={"transcript": transcript})
        return SimpleNamespace(env_reward=body["env_reward"], done=body["done"],
                               metrics=body["metrics"], artifacts=body["artifacts"])

    async def a_close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._call("DELETE", "")
        except (InfraError, httpx.HTTPError) as exc:  # a dead service closed it with itself
            log.warning("closing session %s failed: %r", self.url, exc)

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            def send() -> Any:
                return self.pool.aclient().request(
                    method, self.url + path,
                    timeout=httpx.Timeout(POLL_S + 30.0, connect=5.0), **kwargs)

            # Each is safe to send twice: a verify sent again gets the service's one verdict.
            r = await self.pool.resend_once(send)
        except httpx.TransportError as exc:
            self.pool.mark_down(self.service, exc)
            raise ServiceLostError(f"rollout service {self.service.url} died mid-session "
                                   f"({type(exc).__name__}: {exc})") from exc
        if r.status_code == 404:
            raise ServiceLostError(f"rollout service {self.service.url} no longer knows "
                                   f"{self.url} (restarted?)")
        if r.status_code == 422:
            raise_remote(error_of(r), self.service.url)
        if r.status_code != 200:
            raise InfraError(f"{method} {self.url}{path}: HTTP {r.status_code}: {r.text[:500]}")
        return r.json()
