"""`HarborSessionFactory`: rollouts on demand, bounded, retried, and never lost.

    factory = partial(HarborSessionFactory, proxy_url, split=tasks, harness="mini-swe-agent",
                      sandbox="local", llm_url=engine_url, model="tiny")(sampling=policy)
    result = await factory.rollout(seed=group_id)      # -> RolloutResult, never raises
    session = factory.create(task, seed=k)              # OpenEnv/TRL path: a HarborSession

One decision: `rollout()` owns the whole life of a rollout and always returns a `RolloutResult`
with a cause; only infrastructure that failed before the model was asked anything is retried
(SandboxStartError, ProxyUnreachableError, AgentStartError; exponential backoff), so a retry
never hides a policy's failure and never costs engine time twice. Every result is counted in
`factory.counts` (by cause) before it is returned; `factory.retries` counts retried attempts.

Task selection: `seed=k` picks `split[k % len(split)]` unless `task` names one (a Harbor Task, a
task directory, or a task name in the split; a name the split lacks raises); every rollout of a
GRPO group passes the same seed, so the group shares one task. With neither, tasks are taken
round-robin.

The proxy: `proxy_url` is a running capture proxy (its admin key from `admin_key=` or
$HARNESS_CAPTURE_ADMIN_KEY). With `proxy_url=None` and `llm_url=` an engine, the factory starts
its own in-process `CaptureServer` and stops it in `close()`.

What it refuses to do: score (rewards are the verifier's), or retry a rollout whose agent already
reached the model (a timeout, a wrong answer and a crash mid-run are all results).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from openenv.core.harness.rollout import ResourceSessionFactory

from harness.service.agents import get_agent
from harness.service.proxy_link import ADMIN_KEY_ENV, ProxyLink
from harness.service.session import HarborSession, SandboxBackend, SandboxRequest, SessionConfig
from harness.shared.backoff import backoff_delay
from harness.shared.errors import CAUSES, AgentTimeoutError, Cause, HarnessError, cause_of
from harness.shared.outcome import build_outcome
from harness.shared.per_loop import PerLoop
from harness.shared.rollout import RolloutResult
from harness.shared.seeds import check_run_seed

__all__ = ["HarborSessionFactory", "ProxyLink", "match_task", "resolve_split", "sandbox_backend"]

log = logging.getLogger(__name__)


class HarborSessionFactory(ResourceSessionFactory[HarborSession]):
    """Sessions and whole rollouts of one agent (`harness`) on a split of Harbor tasks.

    Args:
        proxy_url: the capture proxy's URL, or None to start one on `llm_url`.
        split: the tasks (list of Harbor Tasks / task dirs, or a spec `harness.tasks` loads).
        harness: agent name in `harness.service.agents.AGENTS` (or a `HarnessAgent` subclass).
        sandbox: "local" (bubblewrap), a Harbor environment type ("docker", "e2b", ...), or a
            callable `SandboxRequest -> BaseEnvironment`.
        llm_url: the engine URL (only used to start an in-process proxy).
        model: the served model name the agent asks for.
        sampling: the trainer's sampling policy, enforced by the proxy on every call. Its
            `seed` (the run's --seed; optional) makes each rollout's sampling reproducible:
            harness.shared.seeds derives the rollout's from it, its task, seed and episode_id.
        max_tokens: optional per-call completion cap added to the sampling policy.
        rollout_caps: per-rollout caps the proxy keeps on every agent's engine calls and
            completion tokens, `{"calls": int|None, "tokens": int|None}` (capture.caps; None:
            `capture.caps.default_caps(max_steps, max_tokens)`); calls past them are refused.
        max_concurrent_rollouts: rollouts in flight at once in `rollout()`.
        agent_timeout_s / verifier_timeout_s / max_steps: limits per rollout.
        reward_key: which key of a multi-reward reward.json is `env_reward`.
        max_attempts / backoff_s: infra retries (attempt n waits backoff_s * 2**(n-1), jittered).
        preinstalled: use the host's agent CLIs (default: True for "local", else False).
    """

    def __init__(
        self,
        proxy_url: str | None = None,
        *,
        split: Any,
        harness: str = "mini-swe-agent",
        sandbox: Any = "local",
        llm_url: str | None = None,
        model: str = "tiny",
        sampling: dict[str, Any] | None = None,
        admin_key: str | None = None,
        max_concurrent_rollouts: int = 4,
        agent_timeout_s: float = 600.0,
        verifier_timeout_s: float = 300.0,
        max_steps: int = 30,
        max_tokens: int | None = None,
        rollout_caps: dict[str, int | None] | None = None,
        reward_key: str | None = None,
        max_attempts: int = 3,
        backoff_s: float = 1.0,
        preinstalled: bool | None = None,
    ) -> None:
        problems = []
        if max_concurrent_rollouts < 1:
            problems.append(f"max_concurrent_rollouts must be >= 1 (got {max_concurrent_rollouts})")
        if max_attempts < 1:
            problems.append(f"max_attempts must be >= 1 (got {max_attempts})")
        if proxy_url is None and llm_url is None:
            problems.append("give proxy_url (a running capture proxy) or llm_url (to start one)")
        try:
            # A HarnessAgent subclass is accepted as is (an agent not in the registry, a fake).
            agent_cls = harness if isinstance(harness, type) else get_agent(harness)
        except KeyError as exc:
            problems.append(str(exc.args[0]).rstrip("."))
        try:
            self.tasks = resolve_split(split)
        except (ValueError, FileNotFoundError) as exc:
            problems.append(f"split: {exc}")
        try:
            check_run_seed(sampling or {})  # the run's seed (harness.shared.seeds)
        except ValueError as exc:
            problems.append(str(exc))
        try:
            backend = sandbox_backend(sandbox)
        except ValueError as exc:
            problems.append(f"sandbox: {exc}")
        if proxy_url is not None and not (admin_key or os.environ.get(ADMIN_KEY_ENV)):
            problems.append(
                f"the capture proxy at {proxy_url} needs its admin key "
                f"(admin_key= or ${ADMIN_KEY_ENV})"
            )
        # Every problem at once, before any process (proxy, sandbox) starts.
        if problems:
            raise ValueError("HarborSessionFactory: " + "; ".join(problems))

        self.harness = agent_cls.NAME
        self.max_concurrent_rollouts = max_concurrent_rollouts
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.proxy = ProxyLink.connect(proxy_url, admin_key=admin_key, engine_url=llm_url)
        policy = dict(sampling or {})
        if max_tokens is not None:
            policy["max_tokens"] = max_tokens
        self.config = SessionConfig(
            agent_cls=agent_cls,
            sandbox=backend,
            proxy=self.proxy,
            model=model,
            sampling=policy,
            max_steps=max_steps,
            rollout_caps=rollout_caps,
            agent_timeout_s=agent_timeout_s,
            verifier_timeout_s=verifier_timeout_s,
            reward_key=reward_key,
            preinstalled=(sandbox == "local") if preinstalled is None else preinstalled,
        )
        self.counts: dict[Cause, int] = dict.fromkeys(CAUSES, 0)
        self.retries = 0
        self._round_robin = itertools.count()
        # Rollouts in flight on one event loop: an asyncio semaphore belongs to its loop.
        self._semaphores = PerLoop(lambda: asyncio.Semaphore(self.max_concurrent_rollouts))

    # ---- OpenEnv ResourceSessionFactory ------------------------------------------------------

    def create(
        self, task: Any = None, seed: int | None = None, episode_id: str | None = None
    ) -> HarborSession:
        """A started session (sandbox up, agent running) on its own loop thread.

        Infra failures while starting (sandbox, proxy) are retried like `rollout()`'s; the last
        one is raised. TRL's worker scores a failed create as unscorable."""
        for attempt in range(1, self.max_attempts + 1):
            session = self._new_session(task, seed, episode_id)
            try:
                session.start()
                return session
            except BaseException as exc:
                session.close()  # also ends the session's loop thread
                retryable = isinstance(exc, HarnessError) and exc.retryable
                if not retryable or attempt == self.max_attempts:
                    raise
                self.retries += 1
                time.sleep(self._backoff(attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def a_create(
        self, task: Any = None, seed: int | None = None, episode_id: str | None = None
    ) -> HarborSession:
        """A started session on the running loop (start-up infra failures retried)."""
        for attempt in range(1, self.max_attempts + 1):
            session = self._new_session(task, seed, episode_id)
            try:
                await session.a_start()
                return session
            except HarnessError as exc:
                if not exc.retryable or attempt == self.max_attempts:
                    raise
                self.retries += 1
                await asyncio.sleep(self._backoff(attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    # ---- whole rollouts ----------------------------------------------------------------------

    async def rollout(
        self, task: Any = None, seed: int | None = None, episode_id: str | None = None
    ) -> RolloutResult:
        """Run one rollout to a `RolloutResult` (bounded concurrency, infra retries)."""
        episode_id = episode_id or uuid.uuid4().hex
        chosen = self.pick_task(task, seed)
        async with self._semaphores.get():
            attempt = 0
            backoff_total = 0.0
            while True:
                attempt += 1
                result, error = await self._attempt(chosen, seed, episode_id)
                retry = (
                    error is not None
                    and isinstance(error, HarnessError)
                    and error.retryable
                    and attempt < self.max_attempts
                )
                if not retry:
                    break
                self.retries += 1
                delay = self._backoff(attempt)
                log.warning(
                    "rollout %s attempt %d: %s; retrying in %.1f s",
                    episode_id,
                    attempt,
                    result.error,
                    delay,
                )
                await asyncio.sleep(delay)
                backoff_total += delay
        result.attempts = attempt
        if backoff_total:
            result.timings["backoff_s"] = backoff_total
        self.counts[result.cause] += 1
        return result

    def pick_task(self, task: Any = None, seed: int | None = None) -> Any:
        """The rollout's task: `task` if it names one, else split[seed % n], else round-robin."""
        named = match_task(self.tasks, task) if task is not None else None
        if named is not None:
            return named
        wanted = task.get("task") or task.get("task_id") or task.get("task_name") \
            if isinstance(task, dict) else task
        if isinstance(wanted, (str, Path)):
            # A name the split lacks is a caller's mistake: running the seed's task instead
            # would train one task under another's name, and nothing would fail.
            raise ValueError(f"task {str(wanted)!r} is not in this factory's split of "
                             f"{len(self.tasks)} tasks: name one of them (or pass none and a seed)")
        index = seed if seed is not None else next(self._round_robin)
        return self.tasks[index % len(self.tasks)]

    @property
    def metrics(self) -> dict[str, int]:
        """Flat counters for a metrics sink: rollouts/<cause> and rollouts/retries."""
        return {
            **{f"rollouts/{c}": n for c, n in self.counts.items()},
            "rollouts/retries": self.retries,
        }

    def close(self) -> None:
        """Stop the in-process proxy if this factory started one."""
        self.proxy.close()

    async def aclose(self) -> None:
        """`close()` plus the running loop's HTTP client to the proxy."""
        await self.proxy.release_loop()
        self.close()

    # ---- internals ---------------------------------------------------------------------------

    def _new_session(self, task: Any, seed: int | None, episode_id: str | None) -> HarborSession:
        return HarborSession(
            self.pick_task(task, seed), self.config, seed=seed, episode_id=episode_id
        )

    async def _attempt(
        self, task: Any, seed: int | None, episode_id: str
    ) -> tuple[RolloutResult, BaseException | None]:
        t0 = time.monotonic()
        session = HarborSession(task, self.config, seed=seed, episode_id=episode_id)
        result = RolloutResult(
            cause="infra_failure", task_id=session.task_id, seed=seed, episode_id=episode_id
        )
        error: BaseException | None = None
        try:
            await session.a_start()
            # On timeout session.timed_out is set; the turns it captured still train.
            with contextlib.suppress(AgentTimeoutError):
                await session.a_wait_for_completion()
            try:
                verified = await session.a_verify()
            finally:
                result.verifier_output = session.verifier_output
            result.rewards = dict(session.rewards)
            result.env_reward = verified.env_reward
            result.trace = await self._fetch_trace(session)
            result.outcome = build_outcome(
                result.trace, env_reward=result.env_reward, timed_out=session.timed_out
            )
            # A step limit is the task's budget, not a clock: the verifier says how it went.
            # `outcome.timed_out` still tells a reward function it was cut short (issue 15).
            result.cause = _cause_of_finished(
                session.timed_out and not session.hit_step_limit, result.env_reward,
                tampered=bool(session.tampered),
            )
            if session.tampered:
                result.error = "tampered: " + "; ".join(session.tampered)
        except Exception as exc:
            error = exc
            result.cause = cause_of(exc)
            result.error = f"{type(exc).__name__}: {exc}"
            result.rewards = dict(session.rewards)
        finally:
            await session.a_close()
            result.timings = {**session.timings, "total": time.monotonic() - t0}
        return result, error

    async def _fetch_trace(self, session: HarborSession) -> Any:
        try:
            return await session.a_fetch_training_trace()
        except HarnessError:
            raise
        except Exception as exc:
            # Nothing trainable (only aux calls, or no engine tokens) is a result, not a failure:
            # the rollout is counted by its cause and carries no trace.
            if type(exc).__name__ == "NothingTrainableError":
                log.info("rollout on %s captured nothing trainable: %s", session.task_id, exc)
                return None
            raise

    def _backoff(self, attempt: int) -> float:
        """Seconds before attempt + 1 (harness.shared.backoff)."""
        return backoff_delay(self.backoff_s, attempt)


def _cause_of_finished(timed_out: bool, env_reward: float | None, *, tampered: bool) -> Cause:
    """The cause of a rollout that ran and was graded (tampering outranks a timeout). `timed_out`:
    it ran past its time limit; one stopped at its step limit is "ok" or "model_failure" by its
    reward (in the main command nearly every rollout takes its one step)."""
    if tampered:
        return "tampered"
    if timed_out:
        return "timeout"
    return "ok" if env_reward is not None and env_reward > 0 else "model_failure"


# ---- sandboxes: "local" (bubblewrap), a Harbor environment type, or a callable ------------------


def sandbox_backend(sandbox: Any) -> SandboxBackend:
    """Translate the `sandbox=` option into how a session builds its Harbor environment."""
    if isinstance(sandbox, SandboxBackend):
        return sandbox
    if callable(sandbox):
        return SandboxBackend(make=sandbox)
    if sandbox == "local":
        from harness.service.sandboxes.ports import sandbox_url

        return SandboxBackend(make=_local_environment, agent_url=sandbox_url)
    if isinstance(sandbox, str):
        from harbor.models.environment_type import EnvironmentType

        try:
            EnvironmentType(sandbox)
        except ValueError:
            known = ", ".join(["local", *sorted(t.value for t in EnvironmentType)])
            raise ValueError(f"unknown sandbox {sandbox!r}; known: {known}") from None
        return SandboxBackend(make=lambda request: _harbor_environment(sandbox, request))
    raise ValueError(
        f"sandbox must be 'local', a Harbor environment type or a callable, not {sandbox!r}"
    )


def _trial_paths(request: SandboxRequest) -> Any:
    from harbor.models.trial.paths import TrialPaths

    paths = TrialPaths(request.trial_dir)
    paths.mkdir()
    return paths


def _local_environment(request: SandboxRequest) -> Any:
    from harness.service.sandboxes.bwrap import BwrapEnvironment

    task = request.task
    return BwrapEnvironment(
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id=request.name,
        trial_paths=_trial_paths(request),
        task_env_config=task.config.environment,
        ro_binds=request.ro_binds,
        forward_urls=[request.proxy_url],
    )


def _harbor_environment(kind: str, request: SandboxRequest) -> Any:
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType

    task = request.task
    return EnvironmentFactory.create_environment(
        type=EnvironmentType(kind),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id=request.name,
        trial_paths=_trial_paths(request),
        task_env_config=task.config.environment,
    )


# ---- tasks: the split, and which task a rollout runs ---------------------------------------------


def resolve_split(split: Any) -> list[Any]:
    """Harbor Tasks from: a spec for `harness.tasks.load_tasks` ("bundled", "registry:...",
    "hf:...", a folder), one task dir, or a list of Harbor Tasks / HarborTasks / task dirs."""
    from harbor.models.task.task import Task

    from harness.tasks import TaskError, load_tasks

    try:
        if isinstance(split, (str, Path)) and not (Path(split) / "instruction.md").exists():
            split = load_tasks(str(split))
        items = [split] if isinstance(split, (str, Path)) else list(split)
        tasks = [_as_harbor_task(item, Task) for item in items]
    except TaskError as exc:
        raise ValueError(str(exc)) from exc
    if not tasks:
        raise ValueError("split holds no tasks")
    return tasks


def _as_harbor_task(item: Any, task_cls: type) -> Any:
    if isinstance(item, task_cls):
        return item
    if hasattr(item, "harbor"):  # harness.tasks.HarborTask
        return item.harbor()
    path = Path(getattr(item, "path", item))
    if not (path / "instruction.md").exists():
        raise FileNotFoundError(f"{path} is not a Harbor task directory (no instruction.md)")
    return task_cls(path)


def match_task(tasks: list[Any], task: Any) -> Any | None:
    """The split's task that `task` names (a Task, a dir, a name, {"task": name}), or None.

    TRL passes its dataset row as `task`; a row that names no task falls back to the seed.
    """
    if isinstance(task, dict):
        task = task.get("task") or task.get("task_id") or task.get("task_name")
    if task is None:
        return None
    if hasattr(task, "paths") and hasattr(task, "instruction"):
        return task
    wanted = str(task)
    for candidate in tasks:
        names = {
            candidate.name,
            candidate.short_name,
            str(candidate.task_dir),
            Path(str(candidate.task_dir)).name,
        }
        if wanted in names:
            return candidate
    return None
