"""The trainer's side of rollouts as a service: `RemoteSessionFactory`, with no openenv or harbor.

    factory = partial(RemoteSessionFactory, ["http://host-a:8200", "http://host-b:8200"],
                      key=service_key, harness="mini-swe-agent", split="bundled")
    trainer = HarnessAsyncGRPOTrainer(..., harness_session_factory=factory)

Why a class of its own rather than `HarborSessionFactory(url, ...)` dispatching on a URL: that
module imports openenv and harbor at its top (its sessions are OpenEnv ResourceSessions), and the
trainer's process must import neither (vLLM's NCCL engine lives there and cannot share an
environment with openenv). This module imports httpx and `harness.shared.errors` / `harness.shared.outcome`
only; `tests/test_remote_isolation.py` holds it to that.

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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx

from harness.shared.errors import (
    CAUSES,
    TRAINABLE_CAUSES,
    AgentStartError,
    AgentTimeoutError,
    Cause,
    EngineFailureError,
    HarnessError,
    InfraError,
    ProxySessionLostError,
    ProxyUnreachableError,
    RewardMissingError,
    SandboxStartError,
    VerifierError,
)
from harness.shared.outcome import HarnessRolloutOutcome
from harness.shared.per_loop import PerLoop

__all__ = ["KEY_ENV", "JsonTrace", "RemoteRolloutResult", "RemoteSession",
           "RemoteSessionFactory", "ServiceLostError", "ServicePool"]

log = logging.getLogger(__name__)
KEY_ENV = "HARNESS_SERVICE_KEY"
_POLL_S = 20.0  # one long poll; the HTTP read timeout is this plus a margin


class ServiceLostError(InfraError):
    """A rollout service stopped answering (refused, reset, timed out or forgot) mid-rollout."""


# The classes a service names in its 422 answers; anything else is an InfraError.
_ERRORS: dict[str, type[HarnessError]] = {c.__name__: c for c in (
    InfraError, SandboxStartError, AgentStartError, ProxySessionLostError, EngineFailureError,
    ProxyUnreachableError, AgentTimeoutError, VerifierError, RewardMissingError, HarnessError)}


class _RemoteError(InfraError):
    """A service's failure whose class is not known here; keeps its cause and retry flag."""

    def __init__(self, message: str, cause: Cause, retryable: bool) -> None:
        super().__init__(message)
        self._cause, self._retryable = cause, retryable

    @property
    def cause(self) -> Cause:  # type: ignore[override]
        return self._cause

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self._retryable


def _raise_remote(error: dict[str, Any], url: str) -> None:
    name, message = str(error.get("type")), f"[{url}] {error.get('message')}"
    cls = _ERRORS.get(name)
    if cls is not None:
        raise cls(message)
    if name == "NothingTrainableError":
        raise NothingTrainableError(message)
    if error.get("timeout"):
        raise AgentTimeoutError(message)
    raise _RemoteError(f"{name}: {message}", error.get("cause") or "infra_failure",
                       bool(error.get("retryable")))


class NothingTrainableError(ValueError):
    """The service's capture held nothing trainable (trainer/ matches it by name, as capture's)."""


class JsonTrace:
    """A TrainingTrace the service validated, as its JSON dump (no openenv needed to read it)."""

    def __init__(self, dump: dict[str, Any], entries: list[dict[str, Any]] | None = None) -> None:
        if not isinstance(dump, dict) or not isinstance(dump.get("turns"), list):
            raise ValueError("a TrainingTrace dump needs a 'turns' list")
        self._dump = dump
        self._entries = entries or []
        self.turns = [SimpleNamespace(**t) if isinstance(t, dict) else t for t in dump["turns"]]
        self.schema_version = dump.get("schema_version")

    def model_dump(self, mode: str = "json") -> dict[str, Any]:
        return self._dump

    def to_trace_entries(self) -> list[dict[str, Any]]:
        return list(self._entries)


@dataclass
class RemoteRolloutResult:
    """`harness.shared.rollout.RolloutResult`'s fields, from a service (plus which service ran it)."""

    cause: Cause
    task_id: str | None = None
    seed: int | None = None
    episode_id: str | None = None
    trace: JsonTrace | None = None
    outcome: HarnessRolloutOutcome | None = None
    env_reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 1
    timings: dict[str, float] = field(default_factory=dict)
    verifier_output: str | None = None
    service: str | None = None

    @property
    def trainable(self) -> bool:
        return self.cause in TRAINABLE_CAUSES and self.trace is not None

    @classmethod
    def from_json(cls, body: dict[str, Any], service: str) -> RemoteRolloutResult:
        trace = None if body.get("trace") is None else JsonTrace(body["trace"], body.get("entries"))
        o = body.get("outcome")
        outcome = None if o is None else HarnessRolloutOutcome(
            env_reward=o["env_reward"], completion=o["completion"],
            trace=trace.to_trace_entries() if trace else [], tool_call_count=o["tool_call_count"],
            tool_failure_count=o["tool_failure_count"],
            tool_calls_by_name=o["tool_calls_by_name"], timed_out=o["timed_out"])
        if body.get("cause") not in CAUSES:
            raise ValueError(f"service {service} sent an unknown cause {body.get('cause')!r}")
        return cls(cause=body["cause"], task_id=body.get("task_id"), seed=body.get("seed"),
                   episode_id=body.get("episode_id"), trace=trace, outcome=outcome,
                   env_reward=body.get("env_reward"), rewards=dict(body.get("rewards") or {}),
                   error=body.get("error"), attempts=int(body.get("attempts") or 1),
                   timings=dict(body.get("timings") or {}),
                   verifier_output=body.get("verifier_output"), service=service)


class _Service:
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
        self.services = [_Service(u) for u in urls]
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

    def aclient(self) -> httpx.AsyncClient:
        return self._async.get()

    def _new_aclient(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(headers=self._headers, timeout=self.timeout, trust_env=False)

    @property
    def client(self) -> httpx.Client:
        return self._sync

    def pick(self) -> tuple[_Service | None, float]:
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

    def release(self, service: _Service) -> None:
        with self._lock:
            service.in_flight -= 1

    def mark_busy(self, service: _Service, response: httpx.Response) -> None:
        try:
            wait = float(response.headers.get("retry-after", "1"))
        except ValueError:
            wait = 1.0
        service.busy_until = time.monotonic() + max(0.05, wait)

    def mark_down(self, service: _Service, exc: BaseException) -> None:
        log.warning("rollout service %s unreachable (%s: %s); avoiding it for %.0f s",
                    service.url, type(exc).__name__, exc, self.down_s)
        service.down_until = time.monotonic() + self.down_s

    def set_weight_version(self, version: int) -> None:
        """Tell every service's capture proxy the engine's weights changed (a dead one: logged;
        it hears the version with its next rollout)."""
        self.weight_version = version
        for s in self.services:
            try:
                r = self._sync.post(f"{s.url}/v1/weight_version", json={"version": version},
                                    timeout=httpx.Timeout(10.0, connect=2.0))
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
                answers[s.url] = str(_error_of(r).get("message") or f"HTTP {r.status_code}")
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
        body = {"factory": self.options, "task": _task_name(task), "seed": seed,
                "episode_id": episode_id, "weight_version": self.pool.weight_version}
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
                    r = await http.post(f"{service.url}/v1/rollouts", json=body)
                except httpx.TransportError as exc:
                    # Not admitted: nothing ran, so another service may take it.
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

    async def _follow(self, service: _Service, rid: str, seed: int | None, episode_id: str,
                      attempts: int) -> RemoteRolloutResult:
        http = self.pool.aclient()
        deadline = time.monotonic() + self.deadline_s
        url = f"{service.url}/v1/rollouts/{rid}"
        while time.monotonic() < deadline:
            try:
                r = await http.get(url, params={"wait_s": _POLL_S},
                                   timeout=httpx.Timeout(_POLL_S + 30.0, connect=5.0))
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

    def _lost(self, service: _Service, seed: int | None, episode_id: str, attempts: int,
              exc: BaseException) -> RemoteRolloutResult:
        self.pool.mark_down(service, exc)
        service.lost += 1
        self.lost += 1
        return self._failed(seed, episode_id, attempts, service,
                            f"ServiceLostError: rollout service {service.url} died mid-rollout "
                            f"({type(exc).__name__}: {exc})")

    def _failed(self, seed: int | None, episode_id: str, attempts: int,
                service: _Service | None, error: str) -> RemoteRolloutResult:
        log.warning("rollout %s: infra_failure: %s", episode_id, error)
        return RemoteRolloutResult(cause="infra_failure", seed=seed, episode_id=episode_id,
                                   error=error, attempts=attempts,
                                   service=None if service is None else service.url)

    # ---- OpenEnv ResourceSessionFactory ----------------------------------------------------------

    def create(self, task: Any = None, seed: int | None = None,
               episode_id: str | None = None) -> RemoteSession:
        """A started session on the least-loaded service (start-up infra failures retried)."""
        body = {"factory": self.options, "task": _task_name(task), "seed": seed,
                "episode_id": episode_id, "weight_version": self.pool.weight_version}
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
                    r = self.pool.client.post(f"{service.url}/v1/sessions", json=body)
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
                        _raise_remote(_error_of(r), service.url)
                    except HarnessError as exc:
                        error = exc
                attempt += 1
                retryable = isinstance(error, ServiceLostError) or error.retryable
                if not retryable or attempt >= self.max_attempts:
                    raise error
                self.retries += 1
                time.sleep(self.backoff_s * 2 ** (attempt - 1) * random.uniform(0.8, 1.2))
            finally:
                self.pool.release(service)

    async def a_create(self, task: Any = None, seed: int | None = None,
                       episode_id: str | None = None) -> RemoteSession:
        return await asyncio.to_thread(self.create, task, seed, episode_id)

    # ---- the rest of the factory's surface -----------------------------------------------------

    def set_weight_version(self, version: int) -> None:
        self.pool.set_weight_version(version)

    @property
    def metrics(self) -> dict[str, int]:
        return {**{f"rollouts/{c}": n for c, n in self.counts.items()},
                "rollouts/retries": self.retries, "rollouts/lost_with_service": self.lost}

    def close(self) -> None:
        if self._owns_pool:
            self.pool.close()

    async def aclose(self) -> None:
        """Close this event loop's HTTP client (and the pool, when this factory made it)."""
        await self.pool.aclose_loop()
        if self._owns_pool:
            self.pool.close()


class RemoteSession:
    """One session on a service; OpenEnv's TrainableSession surface over HTTP (sync + async)."""

    def __init__(self, pool: ServicePool, service: _Service, sid: str, task_id: str) -> None:
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
                                                           "wait_s": _POLL_S})
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
            r = await self.pool.aclient().request(
                method, self.url + path,
                timeout=httpx.Timeout(_POLL_S + 30.0, connect=5.0), **kwargs)
        except httpx.TransportError as exc:
            self.pool.mark_down(self.service, exc)
            raise ServiceLostError(f"rollout service {self.service.url} died mid-session "
                                   f"({type(exc).__name__}: {exc})") from exc
        if r.status_code == 404:
            raise ServiceLostError(f"rollout service {self.service.url} no longer knows "
                                   f"{self.url} (restarted?)")
        if r.status_code == 422:
            _raise_remote(_error_of(r), self.service.url)
        if r.status_code != 200:
            raise InfraError(f"{method} {self.url}{path}: HTTP {r.status_code}: {r.text[:500]}")
        return r.json()


def _error_of(response: httpx.Response) -> dict[str, Any]:
    try:
        return dict(response.json().get("error") or {})
    except ValueError:
        return {"type": "HTTPError", "message": f"HTTP {response.status_code}: "
                f"{response.text[:500]}"}


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
