"""`HarborSession`: one rollout of one agent on one Harbor task, from sandbox to graded trace.

    start:  sandbox.start -> proxy create_session(sampling) -> agent.setup -> agent.run (a task)
    wait:   the agent runs its own loop to its end, its step limit or its timeout
    verify: every process the agent left killed and the grading dirs made fresh (the local
            sandbox's supervisor; an exec script elsewhere), then the task's own Harbor
            Verifier in the same sandbox -> rewards (reward.txt | .json); a grade the agent
            kept from being fair is 0.0 with `tampered` evidence (see `a_verify`)
    fetch:  the proxy's TrainingTrace for this session (engine token ids + logprobs)
    close:  ALWAYS (error, timeout, cancellation): stop the agent, stop the sandbox (kills every
            process it started), delete the proxy session, remove the trial temp dir

It never drives the agent turn by turn and never scores: the reward is the verifier's, `None`
when it gave none, 0.0 when the agent tampered with its grading. Failures are raised as
`harness.shared.errors` classes (the cause label), foreign errors translated here, at the one place
that calls Harbor, the sandbox and the proxy.

Protocols: OpenEnv 0.10's `TrainableSession` and `LoopOwningSession` (runtime_checkable: method
presence) and the `ResourceSession` ABC (its tool manifest is empty: the agent owns its tools),
so TRL 1.16's `HarnessRolloutWorker` can drive it: `wait_for_completion()` raises a
`TimeoutError` subclass on timeout, `fetch_training_trace()`, `verify(transcript)`, `close()`.

Sync and async twins. The work is async (Harbor environments are async-only), and every await of
one session must run on the loop that started it (its sandbox pipes and HTTP pool belong to that
loop). So: the async twins (`a_*`) are the implementation; a session created by the sync
`factory.create()` gets a private loop thread, and each sync method is the async twin submitted
to the session's loop. Calling a sync method from inside that loop would deadlock, so it raises.

The parts, one file each: this module (the lifecycle above), session_config (what a factory's
sessions share), session_grading (the verifier and the evidence of tampering), session_steps
(the agent's step limit) and session_loop (the asyncio plumbing). SandboxBackend,
SandboxRequest and SessionConfig are importable from here too.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from openenv.core.harness.rollout import ResourceSession, VerifyResult
from openenv.core.harness.training import TrainingTrace

from harness.service.agents.base import HarnessAgent
from harness.service.session_config import (
    SANDBOX_STOP_S,
    SandboxBackend,
    SandboxRequest,
    SessionConfig,
)
from harness.service.session_grading import TaskGrader, is_windows, sandbox_died, verifier_output
from harness.service.session_loop import LoopThread, cancel_and_wait, run_on, uncancellable
from harness.service.session_steps import call_ceiling, ended_at_step_limit, step_guard
from harness.shared.errors import (
    AgentStartError,
    AgentTimeoutError,
    EngineFailureError,
    HarnessError,
    InfraError,
    SandboxStartError,
    VerifierError,
)
from harness.shared.outcome import select_reward
from harness.shared.seeds import rollout_seed

__all__ = ["HarborSession", "SandboxBackend", "SandboxRequest", "SessionConfig"]

log = logging.getLogger(__name__)


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
        self.tampered: list[str] = []  # evidence that the agent kept its grade from being fair
        # The sandbox's pid 1 died under the agent (local sandbox: SandboxDiedError): only the
        # agent's processes run beside it, so the rollout is scored `tampered`, never infra.
        self.sandbox_died: str | None = None
        self.verifier_output: str | None = None  # the grader's stdout/stderr tail, for the record
        self.hit_step_limit = False
        self.killed_before_grading = 0  # processes the agent left running, killed before grading
        self.infra_failures: dict[str, Any] = {}  # the proxy's failed_calls, when any was infra
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: LoopThread | None = None
        self._trial_dir: Path | None = None
        self._env: Any = None
        self._agent: HarnessAgent | None = None
        self._agent_task: asyncio.Task[None] | None = None
        self._close_task: asyncio.Task[None] | None = None
        self._started = False
        self._agent_started_at = 0.0
        self._process_baseline: list[str] | None = None  # remote backends: their own processes

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
        run_on(self._loop, self.a_start())

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        return run_on(self._loop, self.a_wait_for_completion(timeout_s))

    def verify(
        self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None
    ) -> VerifyResult:
        return run_on(self._loop, self.a_verify(transcript, final_state))

    def fetch_training_trace(self) -> TrainingTrace:
        return run_on(self._loop, self.a_fetch_training_trace())

    def fetch_proxy_trace(self) -> list[dict[str, Any]]:
        return self.fetch_training_trace().to_trace_entries()

    def close(self) -> None:
        if self._loop is None:
            return  # never started: nothing to release
        try:
            run_on(self._loop, self.a_close())
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
            from capture.caps import default_caps  # (capture is the service's; imported late)

            info = await cfg.proxy.create_session(
                sampling=self._sampling(),
                step_limit=cfg.max_steps if cfg.agent_cls.PROXY_STEP_LIMIT else None,
                caps=cfg.rollout_caps if cfg.rollout_caps is not None else default_caps(
                    cfg.max_steps, cfg.sampling.get("max_tokens")),
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
        guard = asyncio.create_task(
            step_guard(task, call_ceiling(self.config), self._model_calls, self._agent_name()))
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
        # An engine or proxy failure during the run makes it no sample of the policy, whatever
        # the agent did next (it may have given up, or hung until its timeout): read from the
        # proxy's own record of failed calls, never guessed from the agent's output.
        await self._check_infra_failures()
        if self.timed_out:
            raise AgentTimeoutError(
                f"{self._agent_name()} ran past its {limit:.0f} s limit on task {self.task_id}; "
                "it was stopped (captured turns are kept). Raise agent_timeout_s to allow more."
            )
        if task.cancelled():  # the step guard stopped it at its call ceiling: its step limit
            self.exit_code = -1
            self.hit_step_limit = self.timed_out = True
            return self.exit_code
        exc = task.exception()
        if exc is not None:
            raise exc
        if self.sandbox_died is not None:
            self.exit_code = -1
            return self.exit_code
        assert self._agent is not None and self._agent.result is not None
        self.exit_code = self._agent.result.return_code
        calls, refused = await self._model_calls()
        if ended_at_step_limit(self.config, calls, refused):
            self.hit_step_limit = self.timed_out = True
        if self.exit_code != 0 and calls == 0:
            tail = (self._agent.result.stderr or self._agent.result.stdout or "")[-800:]
            raise AgentStartError(
                f"{self._agent_name()} exited {self.exit_code} before its first model call "
                f"(task {self.task_id}). Output tail:\n{tail}"
            )
        return self.exit_code

    async def a_verify(
        self, transcript: list[dict[str, Any]] | None = None, final_state: Any = None
    ) -> VerifyResult:
        """Grade the sandbox with the task's verifier; `env_reward` is the selected reward key.

        Before the verifier: every process the agent left is killed and the grading dirs are
        made fresh (`prepare_grading`, local sandbox). A grade the agent kept from being fair
        (state it left in the grading dirs, a full disk, a grader killed from inside, a grader
        that works on a fresh copy of the task but not after this agent) is `env_reward` 0.0
        with `self.tampered` holding the evidence: scored, inside the group baseline, never
        left out. A verifier that fails on a fresh copy of the task too raises VerifierError.
        """
        if self._agent_task is not None and not self._agent_task.done():
            raise RuntimeError(
                "verify() while the agent still runs: call wait_for_completion() first"
            )
        if self._env is None or self._trial_dir is None:
            raise RuntimeError("verify() on a session that was never started or is closed")
        t0 = time.monotonic()
        try:
            if self.sandbox_died is not None:
                return self._tampered([self.sandbox_died])
            grader = self._grader()
            prep = await grader.prepare(self._env, self._process_baseline)
            if prep.sandbox_died is not None:
                self.sandbox_died = prep.sandbox_died
            else:
                self.killed_before_grading = prep.killed
            if prep.evidence:
                return self._tampered(prep.evidence)
            try:
                rewards = await grader.run(self._env, self._trial_dir)
            except VerifierError as exc:
                evidence = await grader.failure_evidence(exc, self._env)
                if evidence:
                    return self._tampered(evidence)
                raise
        finally:
            self.timings["verify"] = time.monotonic() - t0
            self.verifier_output = verifier_output(self._trial_dir)
        self.rewards = rewards
        env_reward = select_reward(self.rewards, self.config.reward_key, self.task_id)
        return VerifyResult(
            env_reward=env_reward,
            done=True,
            metrics=self._verify_metrics(),
            artifacts={"task_id": self.task_id, "proxy_session_id": self.proxy_session_id},
        )

    def _verify_metrics(self) -> dict[str, Any]:
        return {
            "rewards": dict(self.rewards),
            "timed_out": self.timed_out,
            "hit_step_limit": self.hit_step_limit,
            "exit_code": self.exit_code,
            "tampered": list(self.tampered),
            "killed_before_grading": self.killed_before_grading,
        }

    def _tampered(self, evidence: list[str]) -> VerifyResult:
        self.tampered = list(evidence)
        self.rewards = {}
        log.warning("rollout on %s tampered with its grading: %s", self.task_id, evidence)
        return VerifyResult(
            env_reward=0.0,
            done=True,
            metrics=self._verify_metrics(),
            artifacts={"task_id": self.task_id, "proxy_session_id": self.proxy_session_id},
        )

    async def _check_infra_failures(self) -> None:
        """Raise EngineFailureError when the proxy recorded engine/proxy failures in this run."""
        if self.proxy_session_id is None:
            return
        stats = await self.config.proxy.stats(self.proxy_session_id)
        failed = stats.get("failed_calls") or {}
        if int(failed.get("infra") or 0) > 0:
            self.infra_failures = dict(failed)
            raise EngineFailureError(
                f"the engine or the capture proxy failed {failed['infra']} call(s) of this "
                f"rollout on {self.task_id} (by kind: {failed.get('by_kind')}); the agent's "
                "run is no sample of the policy"
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

    def _sampling(self) -> dict[str, Any]:
        """The proxy session's policy: the factory's, with the run's seed made this rollout's
        (harness.shared.seeds), so a second run samples the same tokens."""
        sampling = dict(self.config.sampling)
        if sampling.get("seed") is not None:
            sampling["seed"] = rollout_seed(sampling["seed"], self.task_id, self.seed,
                                            self.episode_id)
        return sampling

    async def _start_sandbox(self, agent: HarnessAgent) -> None:
        assert self._trial_dir is not None
        request = SandboxRequest(
            task=self.task,
            trial_dir=self._trial_dir,
            name=f"{self._slug}-{(self.episode_id or uuid.uuid4().hex)[:8]}",
            ro_binds={str(p): str(p) for p in agent.host_paths()},
            proxy_url=await self.config.proxy.agent_url(),  # never the admin listener
        )
        try:
            self._env = self.config.sandbox.make(request)
            await self._env.start(force_build=False)
            if not hasattr(self._env, "prepare_grading") and not is_windows(self._env):
                # A remote backend: note its own processes now, to kill all others at grading.
                from harness.service.sandboxes.grading import process_baseline

                self._process_baseline = await process_baseline(self._env)
        except HarnessError:
            raise
        except Exception as exc:
            raise SandboxStartError(
                f"sandbox for task {self.task_id} did not start: {type(exc).__name__}: {exc}"
            ) from exc

    async def _run_agent(self, agent: HarnessAgent) -> None:
        from harbor.models.agent.context import AgentContext

        from harness.service.sandboxes.errors import SandboxExecTimeoutError

        try:
            await agent.run(self.task.instruction, self._env, AgentContext())
        except SandboxExecTimeoutError as exc:  # the exec's own deadline (a backstop) fired
            self.timed_out = True
            raise AgentTimeoutError(f"{agent.NAME} ran past its exec deadline: {exc}") from exc
        except (HarnessError, asyncio.CancelledError):
            raise
        except Exception as exc:
            died = sandbox_died(exc)
            if died is not None:
                self.sandbox_died = died  # the agent's run ends here; a_verify scores it
                return
            raise InfraError(
                f"running {agent.NAME} in the sandbox failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def _model_calls(self) -> tuple[int, int]:
        assert self.proxy_session_id is not None
        return await self.config.proxy.model_calls(self.proxy_session_id)

    async def _release(self) -> None:
        t0 = time.monotonic()
        if self._agent_task is not None and not self._agent_task.done():
            await cancel_and_wait(self._agent_task)
        if self._env is not None:
            try:
                await asyncio.wait_for(self._env.stop(delete=True), timeout=SANDBOX_STOP_S)
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

    def _grader(self) -> TaskGrader:
        return TaskGrader(self.task, self.task_id, self._slug, self.config,
                          self._verifier_timeout())

