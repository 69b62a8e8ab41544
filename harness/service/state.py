"""The rollout service's state: its capture proxy, factories by options, rollouts and sessions.

What `python -m harness.serve` (serve.py: the command, the docstring with the routes) serves over
HTTP (harness/service/routes.py). It runs in the service's process only (harbor, openenv through
`HarborSessionFactory`), never in the trainer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.responses import JSONResponse, Response

from harness.shared.errors import CAUSES, HarnessError, cause_of

log = logging.getLogger(__name__)

__all__ = ["FACTORY_OPTIONS", "HANDED_GRACE_S", "BadRequest", "Job", "OpenSession",
           "RolloutService", "error_reply", "failure_reply", "result_json"]

# Factory options a client may set; anything else in `factory` is refused by name.
FACTORY_OPTIONS = frozenset({
    "split", "task_count", "harness", "sandbox", "model", "sampling", "max_tokens",
    "agent_timeout_s", "verifier_timeout_s", "max_steps", "reward_key", "max_attempts",
    "backoff_s", "preinstalled", "rollout_caps",
})


class BadRequest(Exception):
    """A request the service refuses (400), with what to send instead."""


def result_json(result: Any) -> dict[str, Any]:
    """A RolloutResult as JSON: the trace as OpenEnv's dump plus its trace entries."""
    outcome = result.outcome
    trace = result.trace
    return {
        "cause": result.cause,
        "task_id": result.task_id,
        "seed": result.seed,
        "episode_id": result.episode_id,
        "env_reward": result.env_reward,
        "rewards": dict(result.rewards),
        "error": result.error,
        "attempts": result.attempts,
        "timings": dict(result.timings),
        "verifier_output": result.verifier_output,
        "trace": None if trace is None else trace.model_dump(mode="json"),
        "entries": None if trace is None else trace.to_trace_entries(),
        "outcome": None if outcome is None else {
            "env_reward": outcome.env_reward,
            "completion": outcome.completion,
            "tool_call_count": outcome.tool_call_count,
            "tool_failure_count": outcome.tool_failure_count,
            "tool_calls_by_name": outcome.tool_calls_by_name,
            "timed_out": outcome.timed_out,
        },
    }


def error_reply(status: int, kind: str, message: str, *, headers: dict[str, str] | None = None,
                **detail: Any) -> JSONResponse:
    """The service's one error answer, `{"error": {"type", "message", ...detail}}`, whatever
    refused the call (key, body, unknown id, a full service, a failed session): the client
    (harness.client.remote_errors) reads it back into the same class."""
    return JSONResponse({"error": {"type": kind, "message": message, **detail}}, status,
                        headers=headers)


def failure_reply(exc: BaseException) -> JSONResponse:
    """A session's failure, 422: its class, cause, whether a retry may help, and whether it was
    a timeout, so the client raises the same `harness.shared.errors` class."""
    return error_reply(422, type(exc).__name__, str(exc)[:4000], cause=cause_of(exc),
                       retryable=bool(isinstance(exc, HarnessError) and exc.retryable),
                       timeout=isinstance(exc, TimeoutError))


# How long a result stays after a poll handed it over: a client whose connection dropped while
# the answer was on its way asks again (harness.client.remote) and gets it, not a 404.
HANDED_GRACE_S = 60.0


@dataclass
class Job:
    task: asyncio.Task[Any]
    request_id: str | None = None  # the client's id for its admission (retries send it again)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    handed: float | None = None  # when a poll handed the result over


@dataclass
class OpenSession:
    session: Any  # HarborSession; None while it starts
    request_id: str | None = None  # the client's id for its create (a resend sends it again)
    waiter: asyncio.Task[int] | None = None
    calls: int = 0  # its client's calls open now (a long poll)
    called: float = field(default_factory=time.monotonic)  # when its client's last call ended
    # The one grading of this session: a verify sent again (its answer lost with a connection)
    # waits for the same verdict instead of running the verifier a second time.
    verdict: asyncio.Task[Any] | None = None


class RolloutService:
    """The service's state: its capture proxy, factories by options, rollouts and sessions."""

    def __init__(self, engine_url: str, *, key: str, tasks: str = "bundled",
                 task_count: int | None = None, max_sessions: int = 8,
                 data_dir: Path | None = None, result_ttl_s: float = 3600.0,
                 defaults: dict[str, Any] | None = None, proxy_host: str = "127.0.0.1",
                 proxy_port: int = 0, proxy_public_url: str | None = None,
                 proxy_tunnel: str | None = None, sandbox: str = "local") -> None:
        if max_sessions < 1:
            raise ValueError(f"--max-sessions must be >= 1 (got {max_sessions})")
        self.engine_url = engine_url.rstrip("/")
        self.key = key
        self.tasks = tasks
        self.task_count = task_count
        self.max_sessions = max_sessions
        self.data_dir = data_dir
        self.result_ttl_s = result_ttl_s
        self.defaults = dict(defaults or {})
        self.proxy_options = {"host": proxy_host, "port": proxy_port,
                              "public_url": proxy_public_url}
        self.proxy_tunnel = proxy_tunnel
        self.sandbox = sandbox  # the sandboxes the proxy is exposed to (remote: public URL)
        # harness.service.local_proxy's, started in start(): the proxy (exposed to remote sandboxes)
        self.local_proxy: Any = None
        self.proxy: Any = None  # its CaptureServer
        self.factories: dict[str, Any] = {}
        self.rollouts: dict[str, Job] = {}
        # A client's request_id -> the rollout or session id it was given (pending while it
        # starts, None when the start failed): a POST sent again after a dropped connection gets
        # the same one.
        self._requests: dict[str, asyncio.Future[str | None]] = {}
        self.sessions: dict[str, OpenSession] = {}
        self._closing: dict[str, asyncio.Task[None]] = {}  # abandoned sessions being closed
        self.admitted = 0
        self.rejected = 0
        self.sessions_graded = 0  # verifier runs asked through sessions (one per session)
        self.starting = 0  # admitted, its factory still being made: holds its slot
        self.durations: list[float] = []  # seconds of each finished rollout, for Retry-After
        self._factory_lock = asyncio.Lock()

    # ---- lifetime ------------------------------------------------------------------------------

    def start(self) -> None:
        # Import the rollout machinery (harbor, openenv) now, not in the first client's request.
        import harness.service.factory  # noqa: F401
        from harness.service.local_proxy import start_local_proxy

        self.local_proxy = start_local_proxy(
            self.engine_url, sandbox=self.sandbox, tunnel=self.proxy_tunnel,
            data_dir=None if self.data_dir is None else self.data_dir / "capture",
            **self.proxy_options)
        self.proxy = self.local_proxy.server

    async def stop(self) -> None:
        for job in list(self.rollouts.values()):
            job.task.cancel()
        await asyncio.gather(*(j.task for j in self.rollouts.values()), return_exceptions=True)
        await asyncio.gather(*self._closing.values(), return_exceptions=True)
        await asyncio.gather(*(s.session.a_close() for s in self.sessions.values()
                               if s.session is not None), return_exceptions=True)
        for factory in self.factories.values():
            with contextlib.suppress(Exception):
                await factory.aclose()
        if self.local_proxy is not None:
            self.local_proxy.stop()

    # ---- bookkeeping ---------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        running = sum(1 for j in self.rollouts.values() if j.finished is None)
        return running + len(self.sessions) + self.starting

    def retry_after_s(self) -> int:
        """A hint: a slot frees about every mean-rollout-time / max_sessions seconds."""
        recent = self.durations[-50:]
        mean = sum(recent) / len(recent) if recent else 5.0
        return max(1, min(60, round(mean / self.max_sessions)))

    def admit(self) -> Response | None:
        self._forget_stale()
        if self.in_flight >= self.max_sessions:
            self.rejected += 1
            return error_reply(
                429, "Busy", f"{self.in_flight} of {self.max_sessions} sessions in flight; "
                "retry later or use another service",
                headers={"Retry-After": str(self.retry_after_s())})
        self.admitted += 1
        return None

    def _forget_stale(self) -> None:
        now = time.monotonic()
        for rid, job in list(self.rollouts.items()):
            if (job.handed is not None and now - job.handed > HANDED_GRACE_S) or \
                    (job.finished is not None and now - job.finished > self.result_ttl_s):
                self.forget(rid)
        # A session no client called for result_ttl_s was left behind (a client that died, or a
        # create whose answer never arrived): closed, so it does not hold its slot for good.
        for sid, held in list(self.sessions.items()):
            if held.session is not None and held.calls == 0 \
                    and now - held.called > self.result_ttl_s and sid not in self._closing:
                self._closing[sid] = asyncio.create_task(self._close_abandoned(sid))

    async def _close_abandoned(self, sid: str) -> None:
        log.warning("closing session %s: no client called it for %.0f s", sid, self.result_ttl_s)
        try:
            await self.close_session(sid)
        except Exception as exc:  # its sandbox is gone with it either way
            log.warning("closing abandoned session %s failed: %r", sid, exc)
        finally:
            self._closing.pop(sid, None)

    def forget(self, rid: str) -> Job | None:
        """Drop a rollout and its client's request id (a later retry of it starts nothing)."""
        job = self.rollouts.pop(rid, None)
        if job is not None and job.request_id is not None:
            self._requests.pop(job.request_id, None)
        return job

    def hand_over(self, rid: str) -> None:
        """A poll is answering with the result: keep it HANDED_GRACE_S for a repeated poll."""
        job = self.rollouts.get(rid)
        if job is not None and job.handed is None:
            job.handed = time.monotonic()

    async def already_started(self, request_id: Any) -> str | None:
        """The rollout or session a client's earlier POST with this `request_id` was given, or
        None: the POST's answer was lost with its connection, and the client sends it again."""
        pending = self._requests.get(request_id) if isinstance(request_id, str) else None
        return None if pending is None else await asyncio.shield(pending)

    async def factory(self, options: dict[str, Any]) -> Any:
        """The HarborSessionFactory for these options (made once, in a thread: tasks load)."""
        unknown = sorted(set(options) - FACTORY_OPTIONS)
        if unknown:
            raise BadRequest(f"unknown factory option(s) {unknown}; known: {sorted(FACTORY_OPTIONS)}")
        merged = {**self.defaults, **{k: v for k, v in options.items() if v is not None}}
        key = hashlib.sha256(json.dumps(merged, sort_keys=True, default=str).encode()).hexdigest()
        async with self._factory_lock:
            made = self.factories.get(key)
            if made is None:
                made = await asyncio.to_thread(self._make_factory, merged)
                self.factories[key] = made
        return made

    def _make_factory(self, options: dict[str, Any]) -> Any:
        from harness.service.factory import HarborSessionFactory
        from harness.tasks import load_tasks

        options = dict(options)
        split = options.pop("split", None)
        count = options.pop("task_count", None)
        try:
            if split is None or isinstance(split, str):
                split = load_tasks(split or self.tasks, count=count or self.task_count)
            return HarborSessionFactory(
                self.proxy.admin_url, admin_key=self.proxy.admin_key, split=split,
                llm_url=self.engine_url, max_concurrent_rollouts=self.max_sessions, **options)
        except Exception as exc:  # the client's options: its tasks, agent or limits are wrong
            raise BadRequest(f"cannot make a session factory from these options: "
                             f"{type(exc).__name__}: {exc}") from exc

    # ---- rollouts ------------------------------------------------------------------------------

    async def catch_up(self, body: dict[str, Any]) -> None:
        """Take the client's weight version when this proxy missed it (down or restarted).

        Only ever raised: a body built just before a push may carry the version before it. (A
        service serves one engine's run; a new run on a fresh engine restarts it or POSTs
        /v1/weight_version, which sets the version exactly.)"""
        version = body.get("weight_version")
        model = body.get("weight_model")
        if isinstance(version, int) and not isinstance(version, bool) \
                and version > self.proxy.state.weight_version:
            await self.set_weight_version(version, model if isinstance(model, str) else None)

    async def set_weight_version(self, version: int, model: str | None = None, *,
                                 retired: list[str] | None = None) -> None:
        """`model`: the engine model name serving `version` (a LoRA adapter), None: the
        engine's own (capture.state.CaptureState.engine_model). `retired`: engines whose weight
        push failed, taken out of the proxy before the stamp (capture.engines)."""
        from capture.client import AsyncCaptureClient

        async with AsyncCaptureClient(self.proxy.admin_url, self.proxy.admin_key) as capture:
            await capture.set_weight_version(version, model, retired=retired)

    def _expect(self, body: dict[str, Any]) -> tuple[str | None, asyncio.Future[str | None]]:
        """Register a POST's request_id before any await: a resend arriving while this one
        starts waits for its id (set_result) instead of starting a second one."""
        request_id = body.get("request_id") if isinstance(body.get("request_id"), str) else None
        started: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        if request_id is not None:
            self._requests[request_id] = started
        return request_id, started

    def _start_failed(self, request_id: str | None, started: asyncio.Future[str | None]) -> None:
        if request_id is not None:
            self._requests.pop(request_id, None)
        started.set_result(None)  # a resend waiting on it is admitted on its own

    async def start_rollout(self, body: dict[str, Any]) -> str:
        """Start an admitted rollout (its slot was taken by `admit()`, held while starting)."""
        request_id, started = self._expect(body)
        self.starting += 1
        try:
            await self.catch_up(body)
            factory = await self.factory(body.get("factory") or {})
            try:  # a task the split lacks is the caller's mistake: a 400 now, not a 500 later
                factory.pick_task(body.get("task"), body.get("seed"))
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
        except BaseException:
            self._start_failed(request_id, started)
            raise
        finally:
            self.starting -= 1
        rid = uuid.uuid4().hex
        job = Job(asyncio.create_task(factory.rollout(
            task=body.get("task"), seed=body.get("seed"), episode_id=body.get("episode_id"))),
            request_id=request_id)
        self.rollouts[rid] = job
        started.set_result(rid)

        def finished(_: asyncio.Task[Any]) -> None:
            job.finished = time.monotonic()
            self.durations.append(job.finished - job.started)

        job.task.add_done_callback(finished)
        return rid

    async def start_session(self, body: dict[str, Any]) -> tuple[str, Any]:
        """Start an admitted session (its slot was taken by `admit()`, held while starting)."""
        request_id, started = self._expect(body)
        sid = uuid.uuid4().hex
        held = self.sessions[sid] = OpenSession(None, request_id)  # holds its slot meanwhile
        try:
            await self.catch_up(body)
            factory = await self.factory(body.get("factory") or {})
            held.session = await factory.a_create(body.get("task"), seed=body.get("seed"),
                                                  episode_id=body.get("episode_id"))
        except BaseException:
            del self.sessions[sid]
            self._start_failed(request_id, started)
            raise
        started.set_result(sid)
        return sid, held.session

    @contextlib.contextmanager
    def using_session(self, sid: str) -> Iterator[OpenSession]:
        """A started session for one call: a session with a call open, or called within
        result_ttl_s, is its client's; any other was left behind and is closed (_forget_stale)."""
        held = self.sessions.get(sid)
        if held is None or held.session is None:
            raise KeyError(f"session {sid}")
        held.calls += 1
        try:
            yield held
        finally:
            held.calls -= 1
            held.called = time.monotonic()

    async def close_session(self, sid: str) -> None:
        held = self.sessions.get(sid)
        if held is None or held.session is None:
            return  # closed already, or still starting (its start owns it)
        if held.waiter is not None and not held.waiter.done():
            held.waiter.cancel()
        try:
            await held.session.a_close()
        finally:
            self.sessions.pop(sid, None)
            if held.request_id is not None:
                self._requests.pop(held.request_id, None)

    def counts(self) -> dict[str, int]:
        total = dict.fromkeys(CAUSES, 0)
        for factory in self.factories.values():
            for cause, n in factory.counts.items():
                total[cause] += n
        return total

    def metrics(self) -> dict[str, Any]:
        recent = self.durations[-100:]
        return {
            "in_flight": self.in_flight,
            "max_sessions": self.max_sessions,
            "admitted": self.admitted,
            "rejected": self.rejected,
            "rollouts_by_cause": self.counts(),
            "retries": sum(f.retries for f in self.factories.values()),
            "results_held": sum(1 for j in self.rollouts.values()
                                if j.finished is not None and j.handed is None),
            "open_sessions": len(self.sessions),
            "sessions_graded": self.sessions_graded,
            "rollout_s_mean": sum(recent) / len(recent) if recent else None,
            "factories": len(self.factories),
            "weight_version": self.proxy.state.weight_version,  # what its proxy stamps on calls
            # its proxy's engines: URL, sessions pinned, why out (None: live; capture.engines)
            "engines": self.proxy.state.engines.describe(),
        }
