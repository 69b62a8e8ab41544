"""`HarborSession`: one rollout of one agent on one Harbor task, from sandbox to graded trace.

    start:  sandbox.start -> proxy create_session(sampling) -> agent.setup -> agent.run (a task)
    wait:   the agent runs its own loop to its end, its step limit or its timeout
    verify: the task's own Harbor Verifier in the same sandbox -> rewards (reward.txt | .json)
    fetch:  the proxy's TrainingTrace for this session (engine token ids + logprobs)
    close:  ALWAYS (error, timeout, cancellation): stop the agent, stop the sandbox (kills every
            process it started), delete the proxy session, remove the trial temp dir

It never drives the agent turn by turn and never scores: the reward is the verifier's, `None`
when it gave none. Failures are raised as `harness.errors` classes (the cause label), foreign
errors translated here, at the one place that calls Harbor, the sandbox and the proxy.

Protocols: OpenEnv 0.10's `TrainableSession` and `LoopOwningSession` (runtime_checkable: method
presence) and the `ResourceSession` ABC (its tool manifest is empty: the agent owns its tools),
so TRL 1.16's `HarnessRolloutWorker` can drive it: `wait_for_completion()` raises a
`TimeoutError` subclass on timeout, `fetch_training_trace()`, `verify(transcript)`, `close()`.

Sync and async twins. The work is async (Harbor environments are async-only), and every await of
one session must run on the loop that started it (its sandbox pipes and HTTP pool belong to that
loop). So: the async twins (`a_*`) are the implementation; a session created by the sync
`factory.create()` gets a private loop thread, and each sync method is the async twin submitted
to the session's loop. Calling a sync method from inside that loop would deadlock, so it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from openenv.core.harness.rollout import ResourceSession, VerifyResult
from openenv.core.harness.training import TrainingTrace

from harness.agents.base import HarnessAgent
from harness.errors import (
    AgentStartError,
    AgentTimeoutError,
    HarnessError,
    InfraError,
    RewardMissingError,
    SandboxStartError,
    VerifierError,
)
from harness.outcome import select_reward
from harness.session_loop import LoopThread, cancel_and_wait, uncancellable

if TYPE_CHECKING:
    from harness.factory import ProxyLink

__all__ = ["HarborSession", "SandboxBackend", "SandboxRequest", "SessionConfig"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SANDBOX_STOP_S = 30.0  # a sandbox stop past this is logged and skipped (close goes on)
_STEP_POLL_S = 1.0  # how often the step guard asks the proxy for the turn count


@dataclass(frozen=True)
class SandboxRequest:
    """What a sandbox factory gets to build one Harbor environment for one session."""

    task: Any  # harbor.models.task.task.Task
    trial_dir: Path
    name: str
    ro_binds: dict[str, str]  # host path -> sandbox path, read-only (agent CLIs)
    proxy_url: str  # the capture proxy the agent must reach (loopback-forwarded locally)


@dataclass(frozen=True)
class SandboxBackend:
    """How to build a session's Harbor environment, and how the agent inside reaches the proxy."""

    make: Callable[[SandboxRequest], Any]  # -> harbor BaseEnvironment (not started)
    agent_url: Callable[[str], str] = lambda url: url  # proxy URL as seen from inside


@dataclass(frozen=True)
class SessionConfig:
    """Everything a session needs that is the same for every rollout of a factory."""

    agent_cls: type[HarnessAgent]
    sandbox: SandboxBackend
    proxy: ProxyLink  # the factory's capture-proxy link (errors already translated)
    model: str = "tiny"
    sampling: dict[str, Any] = field(default_factory=dict)
    max_steps: int = 30
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 300.0
    reward_key: str | None = None
    preinstalled: bool = True


class HarborSession(ResourceSession):
    """One rollout. Build with `HarborSessionFactory.create()` (sync) or `.a_create()` (async)."""

    def __init__(
        self,
        task: Any,
        config: SessionConfig,
        *,
        seed: int | None = None,
        episode_id: str | None = None,
    ) -> None:
        self.task = task
        self.task_id = str(getattr(task, "name", None) or Path(str(task.task_dir)).name)
        self._slug = "".join(c if c.isalnum() or c in "-_" else "-" for c in self.task_id)
        self.config = config
        self.seed = seed
        self.episode_id = episode_id
        self.timings: dict[str, float] = {}
        self.timed_out = False
        self.exit_code: int | None = None
        self.proxy_session_id: str | None = None
        self.rewards: dict[str, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: LoopThread | None = None
        self._trial_dir: Path | None = None
        self._env: Any = None
        self._agent: HarnessAgent | None = None
        self._agent_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._started = False
        self._agent_started_at = 0.0

    # ---- OpenEnv ResourceSession: the agent owns its loop and its tools ------------------------

    def initial_messages(self) -> list[dict[str, Any]]:
        return [{"role": "user", "content": self.task.instruction}]

    def list_tools(self) -> list[Any]:
        return []  # the agent brings its own tools; nothing is called from outside

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        raise KeyError(
            f"Unknown tool: {name} (a HarborSession exposes no tools; its agent owns them)"
        )

    # ---- sync twins ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start on a private loop thread (what the sync `factory.create()` does)."""
        if self._loop is None:
            self._loop_thread = LoopThread(f"harness-session-{self._slug}")
            self._loop = self._loop_thread.loop
        self._sync(self.a_start())

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        return self._sync(self.a_wait_for_completion(timeout_s))

    def verify(
        self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None
    ) -> VerifyResult:
        return self._sync(self.a_verify(transcript, final_state))

    def fetch_training_trace(self) -> TrainingTrace:
        return self._sync(self.a_fetch_training_trace())

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        return self.fetch_training_trace().to_trace_entries()

    def close(self) -> None:
        if self._loop is None:
            return  # never started: nothing to release
        try:
            self._sync(self.a_close())
        finally:
            if self._loop_thread is not None:
                self._loop_thread.stop()
                self._loop_thread = None

    # ---- async twins -----------------------------------------------------------------------------

    async def a_start(self) -> None:
        """Sandbox, proxy session, agent config, agent launch. Cleans up after itself on failure."""
        if self._started:
            raise RuntimeError("session already started")
        self._started = True
        self._loop = asyncio.get_running_loop()
        cfg = self.config
        try:
            t0 = time.monotonic()
            self._trial_dir = Path(tempfile.mkdtemp(prefix=f"harness-{self._slug}-"))
            agent = cfg.agent_cls(
                self._trial_dir / "agent",
                model_name=cfg.model,
                max_steps=cfg.max_steps,
                timeout_s=self._agent_timeout(),
                preinstalled=cfg.preinstalled,
            )
            self._agent = agent
            await self._start_sandbox(agent)
            self.timings["sandbox_start"] = time.monotonic() - t0

            t1 = time.monotonic()
            info = await cfg.proxy.create_session(
                sampling=cfg.sampling,
                metadata={
                    "task_id": self.task_id,
                    "seed": self.seed,
                    "episode_id": self.episode_id,
                    "harness": agent.NAME,
                },
            )
            self.proxy_session_id = info.session_id
            agent.endpoint_url = cfg.sandbox.agent_url(info.base_urls[agent.DIALECT]).rstrip("/")
            agent.api_key = info.secret
            try:
                await agent.setup(self._env)
            except Exception as exc:
                raise AgentStartError(f"{agent.NAME} setup failed: {exc}") from exc
            self._agent_task = asyncio.create_task(
                self._run_agent(agent), name=f"agent-{agent.NAME}-{self.task_id}"
            )
            self.timings["agent_start"] = time.monotonic() - t1
            self._agent_started_at = time.monotonic()
        except BaseException:
            await self.a_close()
            raise

    async def a_wait_for_completion(self, timeout_s: float | None = None) -> int:
        """The agent's exit code. Raises AgentTimeoutError (a TimeoutError) past the limit,
        AgentStartError when it exited non-zero before its first model call."""
        task = self._require_agent_task()
        limit = self._agent_timeout() if timeout_s is None else timeout_s
        guard = asyncio.create_task(self._step_guard(task, self._call_ceiling()))
        try:
            # asyncio.wait, not wait_for: it neither cancels the agent nor raises its errors, so
            # a cancel of *this* call still propagates while the agent's own end is inspected.
            done, _ = await asyncio.wait({task}, timeout=limit)
            if not done:
                self.timed_out = True
                await cancel_and_wait(task)
        finally:
            guard.cancel()
            await asyncio.wait({guard})
            self.timings["agent_run"] = time.monotonic() - self._agent_started_at
        if self.timed_out:
            raise AgentTimeoutError(
                f"{self._agent_name()} ran past its {limit:.0f} s limit on task {self.task_id}; "
                "it was stopped (captured turns are kept). Raise agent_timeout_s to allow more."
            )
        if task.cancelled():  # the step guard stopped it at its call ceiling: a normal end
            self.exit_code = -1
            return self.exit_code
        exc = task.exception()
        if exc is not None:
            raise exc
        assert self._agent is not None and self._agent.result is not None
        self.exit_code = self._agent.result.return_code
        if self.exit_code != 0 and await self._model_calls() == 0:
            tail = (self._agent.result.stderr or self._agent.result.stdout or "")[-800:]
            raise AgentStartError(
                f"{self._agent_name()} exited {self.exit_code} before its first model call "
                f"(task {self.task_id}). Output tail:\n{tail}"
            )
        return self.exit_code

    async def a_verify(
        self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None
    ) -> VerifyResult:
        """Run the task's verifier in the sandbox; `env_reward` is the selected reward key."""
        from harbor.models.trial.paths import TrialPaths
        from harbor.verifier.verifier import Verifier

        if self._agent_task is not None and not self._agent_task.done():
            raise RuntimeError(
                "verify() while the agent still runs: call wait_for_completion() first"
            )
        if self._env is None or self._trial_dir is None:
            raise RuntimeError("verify() on a session that was never started or is closed")
        t0 = time.monotonic()
        verifier = Verifier(
            task=self.task, trial_paths=TrialPaths(self._trial_dir), environment=self._env
        )
        timeout = self._verifier_timeout()
        try:
            result = await asyncio.wait_for(verifier.verify(), timeout=timeout)
        except TimeoutError as exc:
            raise VerifierError(f"verifier of {self.task_id} ran past {timeout:.0f} s") from exc
        except (FileNotFoundError, ValueError) as exc:
            # Harbor: RewardFileNotFoundError (a FileNotFoundError), RewardFileEmptyError and
            # parse errors; all mean "the verifier left no usable reward".
            raise RewardMissingError(
                f"verifier of {self.task_id} left no usable reward: {exc}. Its tests/test.sh must "
                "write /logs/verifier/reward.txt (a number) or reward.json ({key: number})."
            ) from exc
        except HarnessError:
            raise
        except Exception as exc:
            raise VerifierError(
                f"verifier of {self.task_id} failed: {type(exc).__name__}: {exc}"
            ) from exc
        finally:
            self.timings["verify"] = time.monotonic() - t0
        self.rewards = {k: float(v) for k, v in (result.rewards or {}).items()}
        env_reward = select_reward(self.rewards, self.config.reward_key, self.task_id)
        return VerifyResult(
            env_reward=env_reward,
            done=True,
            metrics={
                "rewards": dict(self.rewards),
                "timed_out": self.timed_out,
                "exit_code": self.exit_code,
            },
            artifacts={"task_id": self.task_id, "proxy_session_id": self.proxy_session_id},
        )

    async def a_fetch_training_trace(self) -> TrainingTrace:
        """The proxy's validated trace (raises the proxy's NothingTrainableError when empty)."""
        if self.proxy_session_id is None:
            raise RuntimeError("fetch_training_trace() on a session without a proxy session")
        t0 = time.monotonic()
        try:
            return await self.config.proxy.training_trace(self.proxy_session_id)
        finally:
            self.timings["fetch_trace"] = time.monotonic() - t0

    async def a_close(self) -> None:
        """Release everything; idempotent; finishes even if the caller is cancelled meanwhile."""
        if self._close_task is None:
            self._close_task = asyncio.ensure_future(self._release())
        await uncancellable(self._close_task)

    # ---- internals -------------------------------------------------------------------------------

    async def _start_sandbox(self, agent: HarnessAgent) -> None:
        assert self._trial_dir is not None
        request = SandboxRequest(
            task=self.task,
            trial_dir=self._trial_dir,
            name=f"{self._slug}-{(self.episode_id or uuid.uuid4().hex)[:8]}",
            ro_binds={str(p): str(p) for p in agent.host_paths()},
            proxy_url=self.config.proxy.url,
        )
        try:
            self._env = self.config.sandbox.make(request)
            await self._env.start(force_build=False)
        except HarnessError:
            raise
        except Exception as exc:
            raise SandboxStartError(
                f"sandbox for task {self.task_id} did not start: {type(exc).__name__}: {exc}"
            ) from exc

    async def _run_agent(self, agent: HarnessAgent) -> None:
        from harbor.models.agent.context import AgentContext

        from harness.sandboxes.errors import SandboxExecTimeoutError

        try:
            await agent.run(self.task.instruction, self._env, AgentContext())
        except SandboxExecTimeoutError as exc:  # the exec's own deadline (a backstop) fired
            self.timed_out = True
            raise AgentTimeoutError(f"{agent.NAME} ran past its exec deadline: {exc}") from exc
        except (HarnessError, asyncio.CancelledError):
            raise
        except Exception as exc:
            raise InfraError(
                f"running {agent.NAME} in the sandbox failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _call_ceiling(self) -> int:
        """Engine calls after which the session stops the agent itself.

        A CLI without a step option (Codex) is stopped at max_steps. A CLI with one gets room
        above it: its own limit is soft (opencode's `steps` only withdraws the tools, and a model
        that calls tools anyway went on for 65 calls in 120 s, measured against capture's fake
        engine), and aux calls (titles, summaries) count at the proxy too.
        """
        steps = self.config.max_steps
        return steps * 2 + 4 if self.config.agent_cls.NATIVE_STEP_LIMIT else steps

    async def _step_guard(self, task: asyncio.Task[None], ceiling: int) -> None:
        """Stop the agent once the proxy counted `ceiling` engine calls in this session."""
        while not task.done():
            await asyncio.sleep(_STEP_POLL_S)
            with contextlib.suppress(Exception):
                if await self._model_calls() >= ceiling:
                    log.info("%s reached %d engine calls; stopping it", self._agent_name(), ceiling)
                    await cancel_and_wait(task)
                    return

    async def _model_calls(self) -> int:
        assert self.proxy_session_id is not None
        return await self.config.proxy.model_calls(self.proxy_session_id)

    async def _release(self) -> None:
        t0 = time.monotonic()
        if self._agent_task is not None and not self._agent_task.done():
            await cancel_and_wait(self._agent_task)
        if self._env is not None:
            try:
                await asyncio.wait_for(self._env.stop(delete=True), timeout=_SANDBOX_STOP_S)
            except BaseException as exc:  # close must go on to the proxy and the temp dir
                log.warning("stopping the sandbox of %s failed: %r", self.task_id, exc)
        if self.proxy_session_id is not None:
            try:
                await self.config.proxy.delete_session(self.proxy_session_id)
            except BaseException as exc:
                log.warning("deleting proxy session %s failed: %r", self.proxy_session_id, exc)
        if self._trial_dir is not None:
            shutil.rmtree(self._trial_dir, ignore_errors=True)
        if (
            self._loop_thread is not None
        ):  # a private loop ends with the session: so does its client
            await self.config.proxy.release_loop()
        self.timings["teardown"] = time.monotonic() - t0

    def _require_agent_task(self) -> asyncio.Task[None]:
        if self._agent_task is None:
            raise RuntimeError("wait_for_completion() on a session whose agent never started")
        return self._agent_task

    def _agent_name(self) -> str:
        return self.config.agent_cls.NAME

    def _agent_timeout(self) -> float:
        task_limit = getattr(getattr(self.task.config, "agent", None), "timeout_sec", None)
        return min(self.config.agent_timeout_s, task_limit or float("inf"))

    def _verifier_timeout(self) -> float:
        task_limit = getattr(getattr(self.task.config, "verifier", None), "timeout_sec", None)
        return min(self.config.verifier_timeout_s, task_limit or float("inf"))

    def _sync(self, coro: Awaitable[T]) -> T:
        loop = self._loop
        if loop is None:
            raise RuntimeError(
                "session not started: use factory.create() or await factory.a_create()"
            )
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()  # type: ignore[attr-defined]
            raise RuntimeError(
                "sync session method called on the session's own loop; await its a_* twin"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()  # type: ignore[arg-type]
