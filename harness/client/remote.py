"""The trainer's side of rollouts as a service: `RemoteSessionFactory`, with no openenv or harbor.

    factory = partial(RemoteSessionFactory, ["http://host-a:8200", "http://host-b:8200"],
                      key=service_key, harness="mini-swe-agent", split="bundled")
    trainer = HarnessAsyncGRPOTrainer(..., harness_session_factory=factory)

Why a class of its own rather than `HarborSessionFactory(url, ...)` dispatching on a URL: that
module imports openenv and harbor at its top (its sessions are OpenEnv ResourceSessions), and the
trainer's process must import neither (vLLM's NCCL engine lives there and cannot share an
environment with openenv). Its modules import httpx, harness.shared and each other only;
tests/test_import_graph.py and tests/test_trainer_isolation.py hold it to that.

It speaks both of the trainer's seams:
- RolloutSource: `await rollout(task, seed, episode_id)` -> `RemoteRolloutResult` (the fields of
  `harness.shared.rollout.RolloutResult`); the service runs the whole rollout with its
  HarborSessionFactory (retries of infra that failed before the model was asked included).
- OpenEnv's session protocol: `create()` / `a_create()` -> `RemoteSession` with
  wait_for_completion / fetch_training_trace / verify / close and their async twins, so TRL's
  `HarnessRolloutWorker` and trainer/'s `SessionDriver` drive it unchanged.

Spreading load: each new rollout goes to the service with the fewest rollouts in flight from this
client, skipping one that answered 429 until its Retry-After has passed and one that refused a
connection for `down_s`. When every service is busy the rollout waits (bounded by
`admission_timeout_s`, then it is an infra failure).

A service that dies: a rollout it had not admitted is retried on another service (no engine time
spent). A rollout it was running is lost with it: an `infra_failure` with the service named,
counted, never retried (the agent had spent engine time; the same rule as a proxy that forgot a
session), and never a hang: every request has a timeout, long polls are bounded, and each rollout
has a deadline (agent + verifier limits + margin) after which it is abandoned as an infra failure.

The trace: the service validated it (OpenEnv's TrainingTrace) before sending it; here it is a
`JsonTrace`, its JSON dump with `.turns` and `.to_trace_entries()`, which `trainer/rows.py`
reads as it reads the OpenEnv object.

The parts, one file each: this module (the factory: admission, retries, deadlines, counts),
service_pool (the services, their load, the HTTP clients), remote_session (one session over
HTTP), remote_results (what a service sends back) and remote_errors (its failures as
harness.shared.errors classes). The public names are all importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import httpx

from harness.client.remote_errors import ServiceLostError, error_of, raise_remote
from harness.client.remote_results import JsonTrace, RemoteRolloutResult
from harness.client.remote_session import RemoteSession
from harness.client.service_pool import POLL_S, Service, ServicePool
from harness.client.spawn import KEY_ENV
from harness.shared.backoff import backoff_delay
from harness.shared.errors import CAUSES, Cause, HarnessError, InfraError
from harness.shared.per_loop import PerLoop

__all__ = ["KEY_ENV", "JsonTrace", "RemoteRolloutResult", "RemoteSession",
           "RemoteSessionFactory", "ServiceLostError", "ServicePool"]

log = logging.getLogger(__name__)


class RemoteSessionFactory:
    """Sessions and whole rollouts on one or several `python -m harness.serve` services.

    Args:
        urls: one service URL or a list; key: their bearer key (or $HARNESS_SERVICE_KEY).
        split / task_count / harness / sandbox / model / max_tokens / agent_timeout_s /
            verifier_timeout_s / max_steps / reward_key / max_attempts / backoff_s: the
            service-side HarborSessionFactory's options (None: the service's default split).
        sampling: the trainer's sampling policy (the proxy enforces it on every call).
        max_concurrent_rollouts: rollouts this client keeps in flight across all services.
        admission_timeout_s: how long a rollout may wait for any service to admit it.
        deadline_margin_s: past agent_timeout_s + verifier_timeout_s + this, a rollout is
            abandoned as an infra failure (the service is asked to cancel it).
    """

    def __init__(self, urls: str | list[str], key: str | None = None, *, split: Any = None,
                 task_count: int | None = None, harness: str = "mini-swe-agent",
                 sandbox: str = "local", model: str = "tiny",
                 sampling: dict[str, Any] | None = None, max_tokens: int | None = None,
                 max_concurrent_rollouts: int = 4, agent_timeout_s: float = 600.0,
                 verifier_timeout_s: float = 300.0, max_steps: int = 30,
                 reward_key: str | None = None, max_attempts: int = 3, backoff_s: float = 1.0,
                 admission_timeout_s: float = 600.0, deadline_margin_s: float = 300.0,
                 connect_timeout_s: float = 5.0, pool: ServicePool | None = None) -> None:
        if max_concurrent_rollouts < 1:
            raise ValueError(f"max_concurrent_rollouts must be >= 1 (got {max_concurrent_rollouts})")
        if not isinstance(sandbox, str) or not isinstance(harness, str):
            raise ValueError("harness and sandbox must be names the service knows (an agent in "
                             "harness.service.agents.AGENTS; 'local', 'docker', ...): a class or a "
                             "callable cannot travel to another process")
        if split is not None and not isinstance(split, str):
            split = [str(getattr(t, "task_dir", getattr(t, "path", t))) for t in split]
        # A pool passed in is shared (one per trainer: its weight version, its view of the
        # services' load); the factory closes only a pool it made itself.
        self._owns_pool = pool is None
        self.pool = pool or ServicePool(urls, key, connect_timeout_s=connect_timeout_s)
        self.options = {
            "split": split, "task_count": task_count, "harness": harness, "sandbox": sandbox,
            "model": model, "sampling": dict(sampling or {}), "max_tokens": max_tokens,
            "agent_timeout_s": agent_timeout_s, "verifier_timeout_s": verifier_timeout_s,
            "max_steps": max_steps, "reward_key": reward_key, "max_attempts": max_attempts,
            "backoff_s": backoff_s,
        }
        self.harness = harness
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.admission_timeout_s = admission_timeout_s
        self.deadline_s = agent_timeout_s + verifier_timeout_s + deadline_margin_s
        self.counts: dict[Cause, int] = dict.fromkeys(CAUSES, 0)
        self.retries = 0
        self.lost = 0  # rollouts lost with a service that died
        # Rollouts in flight on one event loop: an asyncio semaphore belongs to its loop.
        self._semaphores = PerLoop(lambda: asyncio.Semaphore(self.max_concurrent_rollouts))

    # ---- whole rollouts (the trainer's RolloutSource) ------------------------------------------

    async def rollout(self, task: Any = None, seed: int | None = None,
                      episode_id: str | None = None) -> RemoteRolloutResult:
        """One rollout on the least-loaded service; never raises for the rollout's failure."""
        episode_id = episode_id or uuid.uuid4().hex
        async with self._semaphores.get():
            t0 = time.monotonic()  # after this client's own queue: the service's share only
            result = await self._rollout(task, seed, episode_id)
        # client_total - total: admission, HTTP, the long poll's wake-up, the trace's JSON.
        result.timings["client_total"] = time.monotonic() - t0
        if "total" in result.timings:
            result.timings["service_overhead"] = (result.timings["client_total"]
                                                  - result.timings["total"])
        self.counts[result.cause] += 1
        return result

    async def _rollout(self, task: Any, seed: int | None, episode_id: str) -> RemoteRolloutResult:
        # request_id: this rollout's admission, the same in every send of it, so a service
        # that admitted it but whose answer was lost answers a repeat with the same rollout.
        body = {"factory": self.options, "task": _task_name(task), "seed": seed,
                "episode_id": episode_id, "weight_version": self.pool.weight_version,
                "weight_model": self.pool.weight_model, "request_id": uuid.uuid4().hex}
        http = self.pool.aclient()
        attempts = 0
        admission_deadline = time.monotonic() + self.admission_timeout_s
        while True:
            service, wait = self.pool.pick()
            if service is None:
                if time.monotonic() + wait > admission_deadline:
                    return self._failed(seed, episode_id, attempts or 1, None,
                                        f"no rollout service admitted it within "
                                        f"{self.admission_timeout_s:.0f} s (all busy or down)")
                await asyncio.sleep(wait)
                continue
            try:
                try:
                    r = await self.pool.resend_once(
                        lambda url=service.url: http.post(f"{url}/v1/rollouts", json=body))
                except httpx.TransportError as exc:
                    # Not admitted, or admitted by a service now unreachable: another service
                    # may take it (a rollout the unreachable one started runs there unpolled).
                    self.pool.mark_down(service, exc)
                    attempts += 1
                    if attempts >= self.max_attempts * len(self.pool.services):
                        return self._failed(seed, episode_id, attempts, service,
                                            f"no service reachable: {exc!r}")
                    self.retries += 1
                    continue
                if r.status_code == 429:
                    self.pool.mark_busy(service, r)
                    continue
                if r.status_code != 202:
                    return self._failed(seed, episode_id, attempts + 1, service,
                                        f"service refused the rollout: HTTP {r.status_code}: "
                                        f"{r.text[:500]}")
                return await self._follow(service, r.json()["id"], seed, episode_id,
                                          attempts + 1)
            finally:
                self.pool.release(service)

    async def _follow(self, service: Service, rid: str, seed: int | None, episode_id: str,
                      attempts: int) -> RemoteRolloutResult:
        http = self.pool.aclient()
        deadline = time.monotonic() + self.deadline_s
        url = f"{service.url}/v1/rollouts/{rid}"
        while time.monotonic() < deadline:
            try:
                r = await self.pool.resend_once(lambda: http.get(
                    url, params={"wait_s": POLL_S},
                    timeout=httpx.Timeout(POLL_S + 30.0, connect=5.0)))
            except httpx.TransportError as exc:
                return self._lost(service, seed, episode_id, attempts, exc)
            if r.status_code == 404:
                return self._lost(service, seed, episode_id, attempts,
                                  RuntimeError("the service no longer knows the rollout "
                                               "(restarted?)"))
            if r.status_code != 200:
                return self._failed(seed, episode_id, attempts, service,
                                    f"polling failed: HTTP {r.status_code}: {r.text[:500]}")
            body = r.json()
            if not body.get("done"):
                continue
            if body.get("result") is None:
                return self._failed(seed, episode_id, attempts, service,
                                    f"cancelled on the service: {body.get('error')}")
            result = RemoteRolloutResult.from_json(body["result"], service.url)
            result.attempts += attempts - 1
            return result
        with contextlib.suppress(httpx.HTTPError):
            await http.delete(url)
        return self._failed(seed, episode_id, attempts, service,
                            f"no result within {self.deadline_s:.0f} s; abandoned")

    def _lost(self, service: Service, seed: int | None, episode_id: str, attempts: int,
              exc: BaseException) -> RemoteRolloutResult:
        self.pool.mark_down(service, exc)
        service.lost += 1
        self.lost += 1
        return self._failed(seed, episode_id, attempts, service,
                            f"ServiceLostError: rollout service {service.url} died mid-rollout "
                            f"({type(exc).__name__}: {exc})")

    def _failed(self, seed: int | None, episode_id: str, attempts: int,
                service: Service | None, error: str) -> RemoteRolloutResult:
        log.warning("rollout %s: infra_failure: %s", episode_id, error)
        return RemoteRolloutResult(cause="infra_failure", seed=seed, episode_id=episode_id,
                                   error=error, attempts=attempts,
                                   service=None if service is None else service.url)

    # ---- OpenEnv ResourceSessionFactory ----------------------------------------------------------

    def create(self, task: Any = None, seed: int | None = None,
               episode_id: str | None = None) -> RemoteSession:
        """A started session on the least-loaded service (start-up infra failures retried)."""
        # request_id: as a rollout's admission (a create whose answer was lost, sent again,
        # gets the session it started rather than a second one holding a slot unclaimed).
        body = {"factory": self.options, "task": _task_name(task), "seed": seed,
                "episode_id": episode_id, "weight_version": self.pool.weight_version,
                "weight_model": self.pool.weight_model, "request_id": uuid.uuid4().hex}
        deadline = time.monotonic() + self.admission_timeout_s
        attempt = 0
        while True:
            service, wait = self.pool.pick()
            if service is None:
                if time.monotonic() + wait > deadline:
                    raise InfraError(f"no rollout service admitted a session within "
                                     f"{self.admission_timeout_s:.0f} s")
                time.sleep(wait)
                continue
            try:
                try:
                    r = self.pool.resend_once_sync(lambda url=service.url: self.pool.client.post(
                        f"{url}/v1/sessions", json=body))
                except httpx.TransportError as exc:
                    self.pool.mark_down(service, exc)
                    error: HarnessError = ServiceLostError(f"{service.url}: {exc!r}")
                else:
                    if r.status_code == 429:
                        self.pool.mark_busy(service, r)
                        continue
                    if r.status_code == 200:
                        info = r.json()
                        return RemoteSession(self.pool, service, info["id"], info["task_id"])
                    try:
                        raise_remote(error_of(r), service.url)
                    except HarnessError as exc:
                        error = exc
                attempt += 1
                retryable = isinstance(error, ServiceLostError) or error.retryable
                if not retryable or attempt >= self.max_attempts:
                    raise error
                self.retries += 1
                time.sleep(backoff_delay(self.backoff_s, attempt))
            finally:
                self.pool.release(service)

    async def a_create(self, task: Any = None, seed: int | None = None,
                       episode_id: str | None = None) -> RemoteSession:
        return await asyncio.to_thread(self.create, task, seed, episode_id)

    # ---- the rest of the factory's surface -----------------------------------------------------

    def set_weight_version(self, version: int, model: str | None = None, *,
                           retired: list[str] | None = None) -> None:
        self.pool.set_weight_version(version, model, retired=retired)

    @property
    def metrics(self) -> dict[str, int]:
        return {**{f"rollouts/{c}": n for c, n in self.counts.items()},
                "rollouts/retries": self.retries, "rollouts/lost_with_service": self.lost,
                "service/requests_resent": self.pool.resent}

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()

    async def aclose(self) -> None:
        """Close this event loop's HTTP client (and the pool, when this factory made it)."""
        await self.pool.aclose_loop()
        if self._owns_pool:
            self.pool.close()


def _task_name(task: Any) -> Any:
    """What names a task across processes: a name, a dir, or a TRL dataset row's task field."""
    if task is None or isinstance(task, (str, int)):
        return task
    if isinstance(task, dict):
        return task.get("task") or task.get("task_id") or task.get("task_name")
    for attr in ("name", "task_dir", "path"):
        value = getattr(task, attr, None)
        if value is not None:
            return str(value)
    return str(task)
