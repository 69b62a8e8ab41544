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

from harness.service.agents.base import HarnessAgent
from harness.service.session_loop import LoopThread, cancel_and_wait, uncancellable
from harness.shared.errors import (
    AgentStartError,
    AgentTimeoutError,
    EngineFailureError,
    HarnessError,
    InfraError,
    RewardMissingError,
    SandboxStartError,
    VerifierError,
)
from harness.shared.outcome import select_reward
from harness.shared.seeds import rollout_seed

if TYPE_CHECKING:
    from harness.service.proxy_link import ProxyLink

__all__ = ["HarborSession", "SandboxBackend", "SandboxRequest", "SessionConfig"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SANDBOX_STOP_S = 30.0  # a sandbox stop past this is logged and skipped (close goes on)
_STEP_POLL_S = 1.0  # how often the step guard asks the proxy for the turn count
# Exit codes of a command killed by a signal someone sent (HUP, INT, KILL, TERM), not a crash.
_KILLED_BY_SIGNAL = frozenset(128 + n for n in (1, 2, 9, 15))


def _sandbox_died(exc: BaseException) -> str | None:
    """Evidence when `exc` (or what it was raised from) is the sandbox's pid 1 dying under the
    agent (SandboxDiedError: the local sandbox's host side saw it exit unasked); else None."""
    from harness.service.sandboxes.errors import SandboxDiedError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SandboxDiedError):
            return f"the sandbox's pid 1 died while the agent ran: {seen}"
        seen = seen.__cause__ or seen.__context__
    return None


def _is_windows(env: Any) -> bool:
    return str(getattr(env, "os", "linux")).lower().endswith("windows")


async def _disk_full(env: Any) -> str | None:
    """A line of evidence when the sandbox's root is (nearly) full, else None."""
    from harness.service.sandboxes.local import MIN_FREE_BYTES, MIN_FREE_INODES

    sandbox = getattr(env, "sandbox", None)
    if sandbox is None or not getattr(sandbox, "running", False):
        return None
    result = await sandbox.exec(["stat", "-f", "-c", "%a %S %d", "/"], cwd="/", timeout_s=30)
    try:
        blocks, block_size, inodes = (int(x) for x in result.stdout.split())
    except ValueError:
        return None
    if blocks * block_size < MIN_FREE_BYTES or 0 <= inodes < MIN_FREE_INODES:
        return f"the sandbox's disk was full after grading ({blocks * block_size} bytes free)"
    return None


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
    # capture.caps, kept by the proxy on every agent (None: default_caps of max_steps, max_tokens)
    rollout_caps: dict[str, int | None] | None = None
    agent_timeout_s: float = 600.0
    verifier_timeout_s: float = 300.0
    reward_key: str | None = None
    preinstalled: bool = True
    # task dir -> whether its grader gives a reward in a fresh sandbox (the control run that
    # decides whether a missing grade is the agent's doing); shared by a factory's sessions.
    grader_checks: dict[str, bool] = field(default_factory=dict, compare=False)


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
        if refused or (self.config.agent_cls.NATIVE_STEP_LIMIT and calls >= self.config.max_steps):
            # The CLI stopped itself at its own step limit (mini-swe-agent's step_limit counts
            # model calls), or ended on the proxy's refusal of a step past it. One that finished
            # on exactly its last allowed call counts too: it had no step left, which is what
            # `timed_out` tells a reward function.
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
            evidence = await self._prepare_grading()
            if evidence:
                return self._tampered(evidence)
            try:
                rewards = await self._run_verifier(self._env, self._trial_dir)
            except VerifierError as exc:
                evidence = await self._grading_failure_evidence(exc)
                if evidence:
                    return self._tampered(evidence)
                raise
        finally:
            self.timings["verify"] = time.monotonic() - t0
            self.verifier_output = _verifier_output(self._trial_dir)
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

    async def _prepare_grading(self) -> list[str]:
        """Kill the agent's leftovers and reset the grading dirs; the evidence found.

        The local sandbox does it in its supervisor (`prepare_grading`); Harbor's other backends
        through exec (harness/service/sandboxes/grading.py), as far as their exec user can reach.
        """
        prepare = getattr(self._env, "prepare_grading", None)
        if prepare is None:
            if self._process_baseline is None:  # Windows: no /proc, no POSIX shell
                log.warning("no grading reset for %s: not a POSIX environment", self.task_id)
                return []
            from harness.service.sandboxes.grading import reset_for_grading

            baseline = self._process_baseline

            async def prepare() -> Any:
                return await reset_for_grading(self._env, baseline)

        try:
            reset = await prepare()
        except HarnessError:
            raise
        except Exception as exc:
            died = _sandbox_died(exc)
            if died is not None:
                self.sandbox_died = died
                return [died]
            raise InfraError(
                f"could not prepare the sandbox of {self.task_id} for grading: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        self.killed_before_grading = reset.killed
        return reset.evidence

    async def _run_verifier(self, env: Any, trial_dir: Path) -> dict[str, float]:
        """Harbor's Verifier on `env`; its rewards. Failures raised as VerifierError classes."""
        from harbor.models.trial.paths import TrialPaths
        from harbor.verifier.verifier import Verifier

        grading = None
        if not _is_windows(env):
            # A fresh HOME and no user site or git hooks for the grader (local.GRADING_ENV),
            # under whatever the task's own config sets.
            from harness.service.sandboxes.local import grading_env

            config = self.task.config
            grading = grading_env(config.verifier.env, config.environment.env)
        verifier = Verifier(
            task=self.task,
            trial_paths=TrialPaths(trial_dir),
            environment=env,
            verifier_env=grading,
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
        return {k: float(v) for k, v in (result.rewards or {}).items()}

    async def _grading_failure_evidence(self, exc: VerifierError) -> list[str]:
        """Why a failed grade is the agent's doing, from evidence; empty when it is not.

        In order: the sandbox broke (infrastructure: not the agent's); a grading command killed
        by a signal from inside the sandbox (nothing but the agent's code runs there, and the
        supervisor kills only past a deadline, which raises instead); a full disk; and last the
        control run: the task's grader on a fresh sandbox of the same task. If that grades, the
        grader works and it was this sandbox's state, the agent's, that kept it from grading.
        """
        from harness.service.sandboxes.errors import SandboxError

        cause: BaseException | None = exc
        while cause is not None:
            if isinstance(cause, SandboxError):
                return []
            cause = cause.__cause__
        evidence = []
        for command, code in getattr(self._env, "commands_since_reset", []):
            if code in _KILLED_BY_SIGNAL:
                evidence.append(
                    f"grading command {command[:120]!r} was killed by signal {code - 128}"
                )
        if evidence:
            return evidence
        full = await _disk_full(self._env)
        if full:
            return [full]
        if await self._grader_works_on_a_fresh_sandbox():
            return [f"the grader failed after the agent ({exc}) but grades a fresh sandbox"]
        return []

    async def _grader_works_on_a_fresh_sandbox(self) -> bool:
        """The control run: this task's verifier on a new sandbox the agent never touched.

        Cached per task for the factory's life: a broken grader is found once, not per rollout.
        A control that cannot start says nothing about the agent, so it answers False.
        """
        key = str(getattr(self.task, "task_dir", self.task_id))
        cached = self.config.grader_checks.get(key)
        if cached is not None:
            return cached
        trial_dir = Path(tempfile.mkdtemp(prefix=f"harness-control-{self._slug}-"))
        request = SandboxRequest(
            task=self.task,
            trial_dir=trial_dir,
            name=f"{self._slug}-control-{uuid.uuid4().hex[:8]}",
            ro_binds={},
            proxy_url=await self.config.proxy.agent_url(),  # never the admin listener
        )
        env = None
        try:
            env = self.config.sandbox.make(request)
            await env.start(force_build=False)
            if not hasattr(env, "prepare_grading") and not _is_windows(env):
                # The grading dirs (the grader's HOME among them) as a real grading has them.
                from harness.service.sandboxes.grading import process_baseline, reset_for_grading

                await reset_for_grading(env, await process_baseline(env))
        except Exception as exc:
            log.warning("control sandbox for %s did not start: %r", self.task_id, exc)
            works = None
        else:
            try:
                await self._run_verifier(env, trial_dir)
                works = True
            except VerifierError as exc:
                log.warning("the grader of %s fails on a fresh sandbox: %s", self.task_id, exc)
                works = False
        finally:
            if env is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(env.stop(delete=True), timeout=_SANDBOX_STOP_S)
            shutil.rmtree(trial_dir, ignore_errors=True)
        if works is None:
            return False
        self.config.grader_checks[key] = works
        return works

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
            if not hasattr(self._env, "prepare_grading") and not _is_windows(self._env):
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
            died = _sandbox_died(exc)
            if died is not None:
                self.sandbox_died = died  # the agent's run ends here; a_verify scores it
                return
            raise InfraError(
                f"running {agent.NAME} in the sandbox failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _call_ceiling(self) -> int:
        """Engine calls the agent may make; the session stops it when it starts one more.

        A CLI without a step option (Codex) gets max_steps. A CLI with one gets room
        above it: its own limit is soft (opencode's `steps` only withdraws the tools, and a model
        that calls tools anyway went on for 65 calls in 120 s, measured against capture's fake
        engine), and aux calls (titles, summaries) count at the proxy too.
        """
        steps = self.config.max_steps
        return steps * 2 + 4 if self.config.agent_cls.NATIVE_STEP_LIMIT else steps

    async def _step_guard(self, task: asyncio.Task[None], ceiling: int) -> None:
        """Stop the agent once it starts engine call `ceiling + 1` in this session, or once the
        proxy refused it a step past its step limit (it may retry or hang on the error).

        Not at call `ceiling`: that call is the agent's last allowed step, and stopping the
        agent while it is in flight cut its reply and lost the turn, and the tools the reply
        asked for never ran (every 1-step Codex rollout kept no turn at all). The call started
        past the ceiling is cut instead, and a cut call is never recorded as a turn. This poll
        only bounds the run: what the agent may do is bounded by the proxy's refusal, which
        no reply can outrun.
        """
        while not task.done():
            await asyncio.sleep(_STEP_POLL_S)
            with contextlib.suppress(Exception):
                calls, refused = await self._model_calls()
                if calls > ceiling or refused:
                    log.info("%s reached its step limit (%d engine calls, %d refused); stopping "
                             "it", self._agent_name(), calls, refused)
                    await cancel_and_wait(task)
                    return

    async def _model_calls(self) -> tuple[int, int]:
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


VERIFIER_OUTPUT_CHARS = 8000  # per stream: enough for a test report's tail, small in rollouts.jsonl


def _verifier_output(trial_dir: Path) -> str | None:
    """The tail of the verifier's stdout and stderr (Harbor writes them into the trial dir, which
    close() deletes), kept so a run's record shows why a rollout got its grade."""
    from harbor.models.trial.paths import TrialPaths

    paths = TrialPaths(trial_dir)
    parts = [p.read_text(errors="replace")[-VERIFIER_OUTPUT_CHARS:]
             for p in (paths.test_stdout_path, paths.test_stderr_path) if p.is_file()]
    return "\n".join(parts) or None
