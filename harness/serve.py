"""`python -m harness.serve`: rollouts as a service, so the trainer's process holds no harbor.

Why it exists: vLLM (whose NCCL weight-transfer engine the trainer imports on GPUs) cannot share an
environment with openenv, and one host cannot carry hundreds of agents, their proxy traffic and
their verifiers beside the trainer. This process owns everything on the rollout side (tasks,
sandboxes, agents, the capture proxy, the verifier) through the one implementation of rollouts,
`HarborSessionFactory`; the trainer reaches it with `harness.remote.RemoteSessionFactory`.

    python -m harness.serve --engine-url http://127.0.0.1:8000 [--tasks bundled] [--port 8200]
        [--sandbox e2b --proxy-host 0.0.0.0 --proxy-port 8100 --proxy-public-url URL]
    -> prints one JSON line {"url", "pid", "proxy"} (never the key; --ready-file gets the key
       too, written 0600 in a 0700 folder); every route but /health wants
       "Authorization: Bearer <key>" (the key: --key-file, $HARNESS_SERVICE_KEY, or made up)
    It serves behind the capture proxy's guard (capture.guard: head size and read time, body
    size and read time, connection cap).

Where it runs: from the project venv (.venv: harbor, openenv), never in the trainer's process.
`python -m harness.train` starts one itself (`spawn_service`, pointed at the engine it launched,
sharing the run's cache, its proxy's per-call log under <output-dir>/capture) unless given
--rollout-service URL[,URL...]; launchers/hf_jobs.py starts one beside the GPU trainer (which
runs from .trainer-venv); on other hosts, start as many as the sandboxes need and list them all.
For remote sandboxes (--sandbox other than local) the proxy is exposed at --proxy-public-url or
through --proxy-tunnel, as harness.train did for its in-process proxy.

Routes (JSON). A body's `factory` is the client's factory options (split, harness, sandbox,
model, sampling, max_tokens, limits); the service keeps one HarborSessionFactory per distinct set.

    GET    /health                      {"ok", "in_flight", "max_sessions"}
    GET    /metrics                     rollouts by cause, retries, admitted, rejected, timings
    POST   /v1/weight_version           {"version"}: the engine's weights changed (every proxy)
    POST   /v1/tasks                    {split, task_count} -> {"tasks": names, in seed order}
                                        | 400 naming the fix (a client's settings check)
    POST   /v1/rollouts                 {factory, task, seed, episode_id, weight_version}
                                        -> 202 {"id"} | 429
    GET    /v1/rollouts/{id}?wait_s=N   long poll -> {"done": false} | {"done": true, "result"}
    DELETE /v1/rollouts/{id}            cancel (if running) and forget
    POST   /v1/sessions                 {factory, task, seed, episode_id} -> {"id", "task_id"}|429
    POST   /v1/sessions/{id}/wait       {"timeout_s", "wait_s"} long poll -> {"done", "exit_code"}
    GET    /v1/sessions/{id}/trace      {"trace": TrainingTrace dump, "entries": trace entries}
    POST   /v1/sessions/{id}/verify     {"transcript"} -> VerifyResult fields
    DELETE /v1/sessions/{id}            close (sandbox, agent, proxy session), idempotent

Admission: at most `--max-sessions` rollouts plus open sessions at once; beyond that 429 with a
Retry-After (seconds) and nothing queued, so a client spreads the load or waits, and one service
never buffers an unbounded backlog. A session failure is answered 422 with {"error": {type,
cause, retryable, message}} so the client raises the same `harness.errors` class.

Results: a finished rollout's result stays until the client fetched it (or DELETEs it); results
nobody fetched are forgotten `--result-ttl-s` after they finished.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from harness.errors import CAUSES, HarnessError, cause_of

__all__ = ["KEY_ENV", "LocalService", "RolloutService", "main", "result_json", "spawn_service"]

log = logging.getLogger("harness.serve")
KEY_ENV = "HARNESS_SERVICE_KEY"
MAX_POLL_S = 30.0  # the longest a long poll holds a request open
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


def error_json(exc: BaseException) -> dict[str, Any]:
    return {"error": {
        "type": type(exc).__name__,
        "cause": cause_of(exc),
        "retryable": bool(isinstance(exc, HarnessError) and exc.retryable),
        "timeout": isinstance(exc, TimeoutError),
        "message": str(exc)[:4000],
    }}


@dataclass
class _Job:
    task: asyncio.Task[Any]
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None


@dataclass
class _OpenSession:
    session: Any  # HarborSession
    waiter: asyncio.Task[int] | None = None


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
        self.proxy: Any = None  # CaptureServer, started in start()
        self.exposure: Any = None  # harness.sandboxes.expose.ProxyExposure, for remote sandboxes
        self.factories: dict[str, Any] = {}
        self.rollouts: dict[str, _Job] = {}
        self.sessions: dict[str, _OpenSession] = {}
        self.admitted = 0
        self.rejected = 0
        self.starting = 0  # admitted, its factory still being made: holds its slot
        self.durations: list[float] = []  # seconds of each finished rollout, for Retry-After
        self._factory_lock = asyncio.Lock()

    # ---- lifetime ------------------------------------------------------------------------------

    def start(self) -> None:
        # Import the rollout machinery (harbor, openenv) now, not in the first client's request.
        import harness.factory  # noqa: F401
        from capture.server import CaptureServer

        self.proxy = CaptureServer(
            self.engine_url, data_dir=None if self.data_dir is None else self.data_dir / "capture",
            **self.proxy_options)
        self.proxy.start()
        if self.sandbox != "local":
            from harness.sandboxes.expose import expose_proxy

            try:
                self.exposure = expose_proxy(
                    self.proxy.url, sandbox=self.sandbox,
                    public_url=self.proxy_options["public_url"], tunnel_command=self.proxy_tunnel)
            except BaseException:
                self.proxy.stop()
                raise
            # Session base URLs handed to agents must be the public ones (a tunnel's is only
            # known once it is up).
            self.proxy.state.public_url = self.exposure.public_url

    async def stop(self) -> None:
        for job in list(self.rollouts.values()):
            job.task.cancel()
        await asyncio.gather(*(j.task for j in self.rollouts.values()), return_exceptions=True)
        await asyncio.gather(*(s.session.a_close() for s in self.sessions.values()),
                             return_exceptions=True)
        for factory in self.factories.values():
            with contextlib.suppress(Exception):
                await factory.aclose()
        if self.exposure is not None:
            self.exposure.close()
        if self.proxy is not None:
            self.proxy.stop()

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
            return JSONResponse(
                {"error": {"type": "Busy", "message": f"{self.in_flight} of {self.max_sessions} "
                           "sessions in flight; retry later or use another service"}},
                status_code=429, headers={"Retry-After": str(self.retry_after_s())})
        self.admitted += 1
        return None

    def _forget_stale(self) -> None:
        now = time.monotonic()
        for rid, job in list(self.rollouts.items()):
            if job.finished is not None and now - job.finished > self.result_ttl_s:
                del self.rollouts[rid]

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
        from harness.factory import HarborSessionFactory
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
        if isinstance(version, int) and not isinstance(version, bool) \
                and version > self.proxy.state.weight_version:
            await self.set_weight_version(version)

    async def set_weight_version(self, version: int) -> None:
        from capture.client import AsyncCaptureClient

        async with AsyncCaptureClient(self.proxy.admin_url, self.proxy.admin_key) as capture:
            await capture.set_weight_version(version)

    async def start_rollout(self, body: dict[str, Any]) -> str:
        """Start an admitted rollout (its slot was taken by `admit()`, held while starting)."""
        self.starting += 1
        try:
            await self.catch_up(body)
            factory = await self.factory(body.get("factory") or {})
            try:  # a task the split lacks is the caller's mistake: a 400 now, not a 500 later
                factory.pick_task(body.get("task"), body.get("seed"))
            except ValueError as exc:
                raise BadRequest(str(exc)) from exc
        finally:
            self.starting -= 1
        rid = uuid.uuid4().hex
        job = _Job(asyncio.create_task(factory.rollout(
            task=body.get("task"), seed=body.get("seed"), episode_id=body.get("episode_id"))))
        self.rollouts[rid] = job

        def finished(_: asyncio.Task[Any]) -> None:
            job.finished = time.monotonic()
            self.durations.append(job.finished - job.started)

        job.task.add_done_callback(finished)
        return rid

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
            "results_held": sum(1 for j in self.rollouts.values() if j.finished is not None),
            "open_sessions": len(self.sessions),
            "rollout_s_mean": sum(recent) / len(recent) if recent else None,
            "factories": len(self.factories),
            "weight_version": self.proxy.state.weight_version,  # what its proxy stamps on calls
        }


# ---- HTTP ----------------------------------------------------------------------------------------


def _service(request: Request) -> RolloutService:
    return request.app.state.service


def _authorized(request: Request) -> bool:
    # As bytes: a header with non-ASCII characters is a wrong key (401), never a TypeError (500).
    given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
    return secrets.compare_digest(given, f"Bearer {_service(request).key}".encode())


def _route(handler: Any) -> Any:
    """Auth, JSON bodies and errors for every route but /health, in one place."""
    async def wrapped(request: Request) -> Response:
        if not _authorized(request):
            return JSONResponse({"error": {"type": "Unauthorized", "message": "send the service "
                                           "key as 'Authorization: Bearer <key>'"}}, 401)
        try:
            body: dict[str, Any] = {}
            if request.method in ("POST", "PUT"):
                raw = await request.body()
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
            return await handler(request, _service(request), body)
        except (BadRequest, json.JSONDecodeError) as exc:
            return JSONResponse({"error": {"type": "BadRequest", "message": str(exc)}}, 400)
        except KeyError as exc:
            return JSONResponse({"error": {"type": "NotFound", "message": f"no {exc.args[0]} "
                                           "here (finished and fetched, or never made)"}}, 404)
    return wrapped


async def health(request: Request) -> Response:
    s = _service(request)
    return JSONResponse({"ok": True, "in_flight": s.in_flight, "max_sessions": s.max_sessions})


async def metrics(request: Request, s: RolloutService, body: dict) -> Response:
    return JSONResponse(s.metrics())


async def weight_version(request: Request, s: RolloutService, body: dict) -> Response:
    version = body.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise BadRequest('send {"version": <int>}')
    await s.set_weight_version(version)
    return JSONResponse({"version": version})


def _wait_s(value: Any) -> float:
    try:
        return max(0.0, min(MAX_POLL_S, float(value or 0.0)))
    except (TypeError, ValueError):
        raise BadRequest(f"wait_s must be a number of seconds, not {value!r}") from None


async def list_tasks(request: Request, s: RolloutService, body: dict) -> Response:
    """The tasks a split spec loads to here, in the order seeds pick them (seed k: k % n)."""
    from harness.tasks import load_tasks

    split, count = body.get("split") or s.tasks, body.get("task_count")
    try:
        tasks = await asyncio.to_thread(load_tasks, split, count=count)
    except Exception as exc:  # every loader error names its fix
        raise BadRequest(f"tasks {split!r}: {exc}") from exc
    if not tasks:
        raise BadRequest(f"tasks {split!r}: no tasks found")
    return JSONResponse({"split": split, "tasks": [t.full_name or t.name for t in tasks]})


async def create_rollout(request: Request, s: RolloutService, body: dict) -> Response:
    busy = s.admit()
    if busy is not None:
        return busy
    return JSONResponse({"id": await s.start_rollout(body)}, 202)


async def get_rollout(request: Request, s: RolloutService, body: dict) -> Response:
    rid = request.path_params["rid"]
    job = s.rollouts.get(rid)
    if job is None:
        raise KeyError(f"rollout {rid}")
    await asyncio.wait({job.task}, timeout=_wait_s(request.query_params.get("wait_s")))
    if not job.task.done():
        return JSONResponse({"done": False})
    del s.rollouts[rid]  # handed over: the client holds it now
    if job.task.cancelled():
        return JSONResponse({"done": True, "result": None, "error": "cancelled"})
    return JSONResponse({"done": True, "result": result_json(job.task.result())})


async def delete_rollout(request: Request, s: RolloutService, body: dict) -> Response:
    job = s.rollouts.pop(request.path_params["rid"], None)
    if job is not None and not job.task.done():
        job.task.cancel()
        await asyncio.wait({job.task})
    return JSONResponse({"deleted": request.path_params["rid"]})


async def create_session(request: Request, s: RolloutService, body: dict) -> Response:
    busy = s.admit()
    if busy is not None:
        return busy
    sid = uuid.uuid4().hex
    s.sessions[sid] = _OpenSession(None)  # holds its slot while it starts
    try:
        await s.catch_up(body)
        factory = await s.factory(body.get("factory") or {})
        session = await factory.a_create(body.get("task"), seed=body.get("seed"),
                                         episode_id=body.get("episode_id"))
    except BadRequest:
        del s.sessions[sid]
        raise
    except Exception as exc:
        del s.sessions[sid]
        return JSONResponse(error_json(exc), 422)
    s.sessions[sid].session = session
    return JSONResponse({"id": sid, "task_id": session.task_id})


def _open(s: RolloutService, request: Request) -> _OpenSession:
    sid = request.path_params["sid"]
    held = s.sessions.get(sid)
    if held is None or held.session is None:
        raise KeyError(f"session {sid}")
    return held


async def wait_session(request: Request, s: RolloutService, body: dict) -> Response:
    held = _open(s, request)
    if held.waiter is None:
        held.waiter = asyncio.create_task(held.session.a_wait_for_completion(body.get("timeout_s")))
    await asyncio.wait({held.waiter}, timeout=_wait_s(body.get("wait_s")))
    if not held.waiter.done():
        return JSONResponse({"done": False})
    exc = held.waiter.exception()
    if exc is not None:
        return JSONResponse(error_json(exc), 422)
    return JSONResponse({"done": True, "exit_code": held.waiter.result(),
                         "timed_out": held.session.timed_out})


async def session_trace(request: Request, s: RolloutService, body: dict) -> Response:
    held = _open(s, request)
    try:
        trace = await held.session.a_fetch_training_trace()
    except Exception as exc:
        return JSONResponse(error_json(exc), 422)
    return JSONResponse({"trace": trace.model_dump(mode="json"),
                         "entries": trace.to_trace_entries()})


async def verify_session(request: Request, s: RolloutService, body: dict) -> Response:
    held = _open(s, request)
    try:
        verdict = await held.session.a_verify(body.get("transcript"))
    except Exception as exc:
        return JSONResponse(error_json(exc), 422)
    return JSONResponse({"env_reward": verdict.env_reward, "done": verdict.done,
                         "metrics": verdict.metrics, "artifacts": verdict.artifacts})


async def close_session(request: Request, s: RolloutService, body: dict) -> Response:
    sid = request.path_params["sid"]
    held = s.sessions.get(sid)
    if held is not None and held.session is not None:
        if held.waiter is not None and not held.waiter.done():
            held.waiter.cancel()
        await held.session.a_close()
        s.sessions.pop(sid, None)
    return JSONResponse({"closed": sid})


def create_app(service: RolloutService) -> Starlette:
    app = Starlette(routes=[
        Route("/health", health),
        Route("/metrics", _route(metrics)),
        Route("/v1/weight_version", _route(weight_version), methods=["POST"]),
        Route("/v1/tasks", _route(list_tasks), methods=["POST"]),
        Route("/v1/rollouts", _route(create_rollout), methods=["POST"]),
        Route("/v1/rollouts/{rid}", _route(get_rollout), methods=["GET"]),
        Route("/v1/rollouts/{rid}", _route(delete_rollout), methods=["DELETE"]),
        Route("/v1/sessions", _route(create_session), methods=["POST"]),
        Route("/v1/sessions/{sid}/wait", _route(wait_session), methods=["POST"]),
        Route("/v1/sessions/{sid}/trace", _route(session_trace), methods=["GET"]),
        Route("/v1/sessions/{sid}/verify", _route(verify_session), methods=["POST"]),
        Route("/v1/sessions/{sid}", _route(close_session), methods=["DELETE"]),
    ])
    app.state.service = service
    return app


# ---- a service as a child process (tests, benchmarks, `harness.train` on one host) -------------


@dataclass
class LocalService:
    """A `python -m harness.serve` child in its own process group."""

    url: str
    key: str
    process: Any  # subprocess.Popen
    log: Path
    reaper: Any = None  # launchers.reaper: kills the group if the process that spawned it dies

    def kill(self) -> None:
        """SIGKILL the service and everything it started (its process group)."""
        import signal

        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self._end_reaper()

    def _end_reaper(self) -> None:
        if self.reaper is not None:
            self.reaper.kill()
            self.reaper.wait()
            self.reaper = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (it closes its sessions and proxy), SIGKILL past `timeout_s`."""
        import signal
        import subprocess

        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._end_reaper()

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def spawn_service(engine_url: str, workdir: Path, *, key: str | None = None,
                  tasks: str = "bundled", task_count: int | None = None, max_sessions: int = 8,
                  timeout_s: float = 120.0, own_cache: bool = True,
                  data_dir: Path | None = None, python: str | Path | None = None,
                  extra_args: list[str] | None = None) -> LocalService:
    """Start a rollout service with its temp dir (and, by default, its own cache and data)
    under `workdir`; wait until it serves (its ready file), or raise with its log's tail.

    `own_cache=False` shares this process's $HARNESS_CACHE (`harness.train`'s local service:
    its sandboxes' cached environments are the ones a run always used); `data_dir` is where the
    capture proxy's per-call log goes (<data_dir>/capture); `python` the interpreter with
    harbor and openenv (default: this one); `extra_args` more `harness.serve` flags."""
    import subprocess

    from launchers.paths import REPO_ROOT

    workdir = Path(workdir)
    (workdir / "tmp").mkdir(parents=True, exist_ok=True)
    private = workdir / "private"  # the ready file holds the key: a folder only we can enter
    private.mkdir(mode=0o700, exist_ok=True)
    private.chmod(0o700)
    ready, log_path = private / "ready.json", workdir / "service.log"
    ready.unlink(missing_ok=True)
    key = key or secrets.token_urlsafe(32)
    env = {**os.environ, KEY_ENV: key, "TMPDIR": str(workdir / "tmp"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    if own_cache:
        env["HARNESS_CACHE"] = str(workdir / "cache")
    command = [str(python or sys.executable), "-m", "harness.serve", "--engine-url", engine_url,
               "--tasks", tasks, "--port", "0", "--max-sessions", str(max_sessions),
               "--data-dir", str(data_dir or workdir / "data"), "--ready-file", str(ready)]
    if task_count is not None:
        command += ["--task-count", str(task_count)]
    command += list(extra_args or [])
    with log_path.open("w") as log_file:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log_file,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    from launchers.reaper import start_reaper

    service = LocalService("", key, process, log_path, start_reaper(process.pid))
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            service.kill()
            why = (f"exited {process.returncode}" if process.returncode is not None
                   else f"did not serve within {timeout_s:.0f} s")
            raise RuntimeError(f"the rollout service {why}; its log ({log_path}) ends:\n"
                               + log_path.read_text()[-3000:])
        time.sleep(0.1)
    service.url = json.loads(ready.read_text())["url"]
    return service


def write_ready(path: Path, ready: dict[str, Any]) -> None:
    """Write the ready file (it holds the key) readable by its owner only, atomically (a reader
    never sees half of it), in a folder only its owner can enter: made 0700 if missing, and
    refused if it exists and others can enter or write it."""
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = folder.stat().st_mode & 0o777
    if mode & 0o077:
        raise SystemExit(f"--ready-file {path}: its folder {folder} is open to other users "
                         f"(mode {mode:o}); the file holds the service key. Put it in a folder "
                         "of mode 0700 (chmod 700)")
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(ready))
    tmp.replace(path)


# ---- command line --------------------------------------------------------------------------------


def _key(args: argparse.Namespace) -> str:
    if args.key_file:
        key = Path(args.key_file).read_text().strip()
        if not key:
            raise SystemExit(f"--key-file {args.key_file} is empty; write the service key in it")
        return key
    return os.environ.get(KEY_ENV) or secrets.token_urlsafe(32)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("python -m harness.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-url", required=True, help="the vLLM engine the capture proxy fronts")
    p.add_argument("--tasks", default="bundled", help="default split (harness.tasks spec)")
    p.add_argument("--task-count", type=int, default=None)
    p.add_argument("--max-sessions", type=int, default=8,
                   help="rollouts + open sessions admitted at once; beyond: 429 + Retry-After")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200, help="0 picks a free port")
    p.add_argument("--key-file", default=None, help=f"the bearer key (else ${KEY_ENV}, else new)")
    p.add_argument("--data-dir", default=None, help="the capture proxy's per-call log lives here")
    p.add_argument("--ready-file", default=None,
                   help="write {url, key} here once serving (0600; its folder must be 0700)")
    p.add_argument("--result-ttl-s", type=float, default=3600.0)
    p.add_argument("--sandbox", default="local",
                   help="the sandboxes the capture proxy is exposed to (a remote one needs "
                        "--proxy-public-url or --proxy-tunnel)")
    p.add_argument("--proxy-host", default="127.0.0.1",
                   help="the capture proxy's agent address (0.0.0.0 only behind a public URL; "
                        "its admin routes then stay on loopback)")
    p.add_argument("--proxy-port", type=int, default=0, help="the capture proxy's port (0: free)")
    p.add_argument("--proxy-public-url", default=None,
                   help="the URL remote sandboxes use to reach the capture proxy")
    p.add_argument("--proxy-tunnel", default=None,
                   help="a command that opens a tunnel to the proxy, with {url}")
    return p


async def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: anyone who can reach it and holds the key can run rollouts",
                    args.host)
    service = RolloutService(
        args.engine_url, key=_key(args), tasks=args.tasks, task_count=args.task_count,
        max_sessions=args.max_sessions, result_ttl_s=args.result_ttl_s,
        data_dir=Path(args.data_dir) if args.data_dir else None, proxy_host=args.proxy_host,
        proxy_port=args.proxy_port, proxy_public_url=args.proxy_public_url,
        proxy_tunnel=args.proxy_tunnel, sandbox=args.sandbox)
    service.start()
    from capture.guard import Limits, guard_app, server_options

    # The proxy's guard (capture.guard): h11's bound on a head, a head's read time, a body's size
    # and read time, the connection cap. Bodies here are small JSON (a transcript to verify).
    limits = Limits(max_body_bytes=16 * 1024 * 1024)
    config = uvicorn.Config(guard_app(create_app(service), limits), host=args.host,
                            port=args.port, log_level="warning", timeout_graceful_shutdown=5,
                            proxy_headers=False, **server_options(limits))
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # raises why it could not bind
            raise SystemExit("the rollout service stopped before it served")
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    ready = {"url": f"http://{host}:{port}", "pid": os.getpid(), "proxy": service.proxy.url}
    if args.ready_file:
        write_ready(Path(args.ready_file), {**ready, "key": service.key})
    # The key is never printed: this line lands in logs (spawn_service's service.log).
    print(json.dumps(ready), flush=True)
    try:
        await serving
    finally:
        await service.stop()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    from harness.run_config import quiet_harbor

    quiet_harbor()
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
