"""The seam between the trainer and sessions: a `RolloutSource` protocol, duck-typed.

The trainer never imports harness/. It calls the user's `harness_session_factory` with its own
sampling policy and gets back either

1. a **RolloutSource**: an object with `async rollout(task=None, seed=None, episode_id=None)`
   returning a result that has the attributes of harness's `RolloutResult` (cause, trace,
   outcome, env_reward, error, ...). `HarborSessionFactory` is one: it bounds concurrency,
   retries infra failures and never raises for a rollout failure; or
2. any OpenEnv **ResourceSessionFactory** whose sessions are `TrainableSession`s
   (`create / wait_for_completion / fetch_training_trace / verify / close`). `SessionDriver`
   below drives those itself, in threads, and sorts every failure into a cause.

Causes (harness's vocabulary): ok, model_failure, timeout (captured turns are trainable,
`timed_out` is flagged), infra_failure, verifier_failure (never trainable, excluded from the
baseline). The driver adds nothing to that list: a trace that is *malformed* is not a cause, it
raises CaptureError and stops the run; a trace that could not be *fetched* (transport) is an
infra_failure.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from trainer.errors import CaptureError, RolloutSourceError

__all__ = [
    "CAUSES",
    "TRAINABLE_CAUSES",
    "Rollout",
    "RolloutExecutor",
    "RolloutOutcome",
    "RolloutSource",
    "SessionDriver",
    "as_rollout_source",
]

log = logging.getLogger(__name__)

# `tampered` (harness: the agent kept its grade from being fair) is scored 0.0 in its group.
TRAINABLE_CAUSES = frozenset({"ok", "model_failure", "timeout", "tampered"})
CAUSES = ("ok", "model_failure", "timeout", "tampered", "infra_failure", "verifier_failure")
# Capture errors that mean "the agent never produced a trainable call" rather than a lie in the
# data: matched by class name because trainer/ does not import capture/ (DESIGN.md section 1).
_NOTHING_TRAINABLE = {"NothingTrainableError"}


@dataclass
class RolloutOutcome:
    """What a reward function sees; the fields of TRL 1.16's HarnessRolloutOutcome."""

    env_reward: float | None
    completion: list[dict]
    trace: list[dict]
    tool_call_count: int
    tool_failure_count: int
    tool_calls_by_name: dict[str, int]
    timed_out: bool


@dataclass
class Rollout:
    """The trainer's own copy of harness's RolloutResult shape (the driver returns these)."""

    cause: str
    task_id: str | None = None
    seed: int | None = None
    episode_id: str | None = None
    trace: Any = None  # openenv TrainingTrace, or None when nothing was captured
    outcome: RolloutOutcome | None = None
    env_reward: float | None = None
    rewards: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    attempts: int = 1
    timings: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class RolloutSource(Protocol):
    """Anything that runs one whole rollout and never raises for the rollout's own failure."""

    async def rollout(self, task: Any = None, seed: int | None = None,
                      episode_id: str | None = None) -> Any: ...


def _tool_counts(entries: list[dict]) -> tuple[dict[str, int], int]:
    """Tool calls by name from chat-dialect responses, and tool results that read as errors."""
    by_name: dict[str, int] = {}
    for e in entries:
        choices = (e.get("response") or {}).get("choices") or [{}]
        for tc in (choices[0].get("message") or {}).get("tool_calls") or []:
            name = (tc.get("function") or tc).get("name")
            if name:
                by_name[name] = by_name.get(name, 0) + 1
    messages = ((entries[-1].get("request") or {}).get("messages") or []) if entries else []
    failures = sum(
        1 for m in messages if m.get("role") == "tool"
        and any(w in str(m.get("content", "")).lower() for w in ("error", "traceback", "failed"))
    )
    return by_name, failures


class RolloutExecutor(Executor):
    """`max_workers` daemon threads for blocking rollouts, apart from asyncio's default pool.

    Why not `asyncio.to_thread`: the default pool has min(32, CPUs + 4) threads (6 on a 2-core
    machine) and is shared with the trainer's own short jobs (scoring, rows), so 8 configured
    concurrent rollouts ran 6 at a time and a step could wait behind an agent. Why daemon
    threads: a rollout blocked in an agent's run must not keep a failed trainer process alive
    (ThreadPoolExecutor's threads are joined at exit), or the other ranks would wait for it.
    """

    def __init__(self, max_workers: int, name: str = "rollout") -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers={max_workers}: must be >= 1")
        self.max_workers = max_workers
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._worker, name=f"{name}-{i}", daemon=True)
                         for i in range(max_workers)]
        for t in self._threads:
            t.start()

    def _worker(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        with self._lock:
            if self._closed:
                raise RuntimeError("RolloutExecutor is shut down")
            future: Future = Future()
            self._work.put((future, fn, args, kwargs))
            return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            if cancel_futures:
                while True:
                    try:
                        item = self._work.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in self._threads:
                self._work.put(None)
        if wait:
            for t in self._threads:
                t.join()


class SessionDriver:
    """Drives an OpenEnv TrainableSession factory as a RolloutSource (sync calls in threads).

    Its blocking calls run on a `RolloutExecutor` of `max_concurrent` threads of its own."""

    def __init__(self, factory: Any, *, max_concurrent: int, wait_timeout_s: float | None = None):
        self.factory = factory
        self.wait_timeout_s = wait_timeout_s
        self._slots = asyncio.Semaphore(max_concurrent)
        self.executor = RolloutExecutor(max_concurrent)

    async def rollout(self, task: Any = None, seed: int | None = None,
                      episode_id: str | None = None) -> Rollout:
        async with self._slots:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.executor, self._run, task, seed,
                                              episode_id or uuid.uuid4().hex)

    def close(self) -> None:
        """Stop taking rollouts; ones already running finish on their (daemon) threads."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    def _run(self, task: Any, seed: int | None, episode_id: str) -> Rollout:
        t0 = time.monotonic()
        r = Rollout(cause="ok", seed=seed, episode_id=episode_id,
                    task_id=None if task is None else str(task))
        try:
            session = self.factory.create(task, seed=seed, episode_id=episode_id)
        except Exception as exc:
            return self._fail(r, "infra_failure", f"create failed: {exc!r}", t0)
        try:
            timed_out = False
            try:
                code = session.wait_for_completion(self.wait_timeout_s)
                if isinstance(code, int) and code != 0:
                    r.cause, r.error = "model_failure", f"agent exited with code {code}"
            except TimeoutError:
                timed_out, r.cause = True, "timeout"
            except Exception as exc:
                return self._fail(r, "infra_failure", f"wait_for_completion failed: {exc!r}", t0)
            try:
                r.trace = session.fetch_training_trace()
            except (ValueError, TypeError, KeyError) as exc:
                if type(exc).__name__ in _NOTHING_TRAINABLE:
                    return self._fail(r, "infra_failure", f"nothing trainable: {exc}", t0)
                raise CaptureError(f"episode {episode_id}: fetch_training_trace returned a "
                                   f"malformed capture: {exc}") from exc
            except Exception as exc:
                if type(exc).__name__ in _NOTHING_TRAINABLE:
                    return self._fail(r, "infra_failure", f"nothing trainable: {exc}", t0)
                return self._fail(r, "infra_failure", f"trace transport failed: {exc!r}", t0)
            entries = r.trace.to_trace_entries() if hasattr(r.trace, "to_trace_entries") else []
            last = entries[-1] if entries else {}
            choices = (last.get("response") or {}).get("choices") or [{}]
            completion = list((last.get("request") or {}).get("messages") or [])
            if choices[0].get("message"):
                completion.append(choices[0]["message"])
            try:
                verdict = session.verify(completion)
            except Exception as exc:
                return self._fail(r, "verifier_failure", f"verify failed: {exc!r}", t0)
            env = getattr(verdict, "env_reward", None)
            r.env_reward = None if env is None else float(env)
            tampered = (getattr(verdict, "metrics", None) or {}).get("tampered")
            if tampered:  # harness's session scored it 0.0; label it so it counts as such
                r.cause, r.error = "tampered", "; ".join(map(str, tampered))
            by_name, failures = _tool_counts(entries)
            r.outcome = RolloutOutcome(
                env_reward=r.env_reward, completion=completion, trace=entries,
                tool_call_count=sum(by_name.values()), tool_failure_count=failures,
                tool_calls_by_name=by_name, timed_out=timed_out,
            )
            r.timings["total_s"] = time.monotonic() - t0
            return r
        finally:
            try:
                session.close()
            except Exception:
                log.warning("closing session %s failed", episode_id, exc_info=True)

    @staticmethod
    def _fail(r: Rollout, cause: str, error: str, t0: float) -> Rollout:
        log.warning("rollout %s (seed %s): %s: %s", r.episode_id, r.seed, cause, error)
        r.cause, r.error, r.trace = cause, error, None
        r.timings["total_s"] = time.monotonic() - t0
        return r


def as_rollout_source(
    harness_session_factory: Callable[..., Any], sampling: dict, *, max_concurrent: int
) -> Any:
    """Call the user's factory with the trainer's sampling policy; adapt what comes back."""
    if hasattr(harness_session_factory, "rollout") or hasattr(harness_session_factory, "create"):
        raise RolloutSourceError(
            "harness_session_factory is already a factory instance; pass a callable that takes "
            "sampling=..., e.g. functools.partial(HarborSessionFactory, proxy_url, split=...), so "
            "the trainer can pin the sampling policy it trains"
        )
    made = harness_session_factory(sampling=sampling)
    if hasattr(made, "rollout") and asyncio.iscoroutinefunction(made.rollout):
        return made
    if hasattr(made, "create"):
        return SessionDriver(made, max_concurrent=max_concurrent)
    raise RolloutSourceError(
        f"harness_session_factory(sampling=...) returned {type(made).__name__}, which has neither "
        "`async rollout(task, seed, episode_id)` nor `create(task, seed, episode_id)`"
    )
