"""Grading a session's sandbox fairly: the task's own verifier, and evidence of tampering.

Why it exists: a reward is only worth training on if the agent could not shape its own grade,
and deciding that is most of what `HarborSession.a_verify` does. Before the verifier every
process the agent left is killed and the grading dirs are made fresh; a grade that fails anyway
is the agent's doing only on evidence (the sandbox's pid 1 died under it, a grading command
killed by a signal from inside, a full disk, or a grader that works on a fresh sandbox of the
same task: the control run). The session keeps the lifecycle; this module keeps those rules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.service.session_config import SANDBOX_STOP_S, SandboxRequest, SessionConfig
from harness.shared.errors import HarnessError, InfraError, RewardMissingError, VerifierError

__all__ = ["VERIFIER_OUTPUT_CHARS", "GradingPrep", "TaskGrader", "disk_full", "is_windows",
           "sandbox_died", "verifier_output"]

log = logging.getLogger(__name__)

# Exit codes of a command killed by a signal someone sent (HUP, INT, KILL, TERM), not a crash.
_KILLED_BY_SIGNAL = frozenset(128 + n for n in (1, 2, 9, 15))
VERIFIER_OUTPUT_CHARS = 8000  # per stream: enough for a test report's tail, small in rollouts.jsonl


def sandbox_died(exc: BaseException) -> str | None:
    """Evidence when `exc` (or what it was raised from) is the sandbox's pid 1 dying under the
    agent (SandboxDiedError: the local sandbox's host side saw it exit unasked); else None."""
    from harness.service.sandboxes.errors import SandboxDiedError

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SandboxDiedError):
            return f"the sandbox's pid 1 died while the agent ran: {seen}"
        seen = seen.__cause__ or seen.__context__
    return None


def is_windows(env: Any) -> bool:
    return str(getattr(env, "os", "linux")).lower().endswith("windows")


async def disk_full(env: Any) -> str | None:
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


def verifier_output(trial_dir: Path) -> str | None:
    """The tail of the verifier's stdout and stderr (Harbor writes them into the trial dir, which
    close() deletes), kept so a run's record shows why a rollout got its grade."""
    from harbor.models.trial.paths import TrialPaths

    paths = TrialPaths(trial_dir)
    parts = [p.read_text(errors="replace")[-VERIFIER_OUTPUT_CHARS:]
             for p in (paths.test_stdout_path, paths.test_stderr_path) if p.is_file()]
    return "\n".join(parts) or None


@dataclass(frozen=True)
class GradingPrep:
    """What preparing a sandbox for grading found: evidence the agent kept its grade from being
    fair, the processes it left (killed), and the sandbox's death when that is what happened."""

    evidence: list[str] = field(default_factory=list)
    killed: int = 0
    sandbox_died: str | None = None


@dataclass(frozen=True)
class TaskGrader:
    """One task's Harbor Verifier, run on a session's sandbox or on a fresh control sandbox."""

    task: Any  # harbor.models.task.task.Task
    task_id: str
    slug: str  # the task id as a name part (sandbox names, temp dirs)
    config: SessionConfig
    timeout_s: float

    async def prepare(self, env: Any, baseline: list[str] | None) -> GradingPrep:
        """Kill the agent's leftovers and reset the grading dirs; the evidence found.

        The local sandbox does it in its supervisor (`prepare_grading`); Harbor's other backends
        through exec (harness/service/sandboxes/grading.py), as far as their exec user can reach.
        `baseline`: a remote backend's own processes, noted at start (None: not POSIX).
        """
        prepare = getattr(env, "prepare_grading", None)
        if prepare is None:
            if baseline is None:  # Windows: no /proc, no POSIX shell
                log.warning("no grading reset for %s: not a POSIX environment", self.task_id)
                return GradingPrep()
            from harness.service.sandboxes.grading import reset_for_grading

            async def prepare() -> Any:
                return await reset_for_grading(env, baseline)

        try:
            reset = await prepare()
        except HarnessError:
            raise
        except Exception as exc:
            died = sandbox_died(exc)
            if died is not None:
                return GradingPrep([died], sandbox_died=died)
            raise InfraError(
                f"could not prepare the sandbox of {self.task_id} for grading: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        return GradingPrep(reset.evidence, killed=reset.killed)

    async def run(self, env: Any, trial_dir: Path) -> dict[str, float]:
        """Harbor's Verifier on `env`; its rewards. Failures raised as VerifierError classes."""
        from harbor.models.trial.paths import TrialPaths
        from harbor.verifier.verifier import Verifier

        grading = None
        if not is_windows(env):
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
        timeout = self.timeout_s
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

    async def failure_evidence(self, exc: VerifierError, env: Any) -> list[str]:
        """Why a failed grade of `env` is the agent's doing, from evidence; empty when it is not.

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
        for command, code in getattr(env, "commands_since_reset", []):
            if code in _KILLED_BY_SIGNAL:
                evidence.append(
                    f"grading command {command[:120]!r} was killed by signal {code - 128}"
                )
        if evidence:
            return evidence
        full = await disk_full(env)
        if full:
            return [full]
        if await self.works_on_a_fresh_sandbox():
            return [f"the grader failed after the agent ({exc}) but grades a fresh sandbox"]
        return []

    async def works_on_a_fresh_sandbox(self) -> bool:
        """The control run: this task's verifier on a new sandbox the agent never touched.

        Cached per task for the factory's life: a broken grader is found once, not per rollout.
        A control that cannot start says nothing about the agent, so it answers False.
        """
        key = str(getattr(self.task, "task_dir", self.task_id))
        cached = self.config.grader_checks.get(key)
        if cached is not None:
            return cached
        trial_dir = Path(tempfile.mkdtemp(prefix=f"harness-control-{self.slug}-"))
        request = SandboxRequest(
            task=self.task,
            trial_dir=trial_dir,
            name=f"{self.slug}-control-{uuid.uuid4().hex[:8]}",
            ro_binds={},
            proxy_url=await self.config.proxy.agent_url(),  # never the admin listener
        )
        env = None
        try:
            env = self.config.sandbox.make(request)
            await env.start(force_build=False)
            if not hasattr(env, "prepare_grading") and not is_windows(env):
                # The grading dirs (the grader's HOME among them) as a real grading has them.
                from harness.service.sandboxes.grading import process_baseline, reset_for_grading

                await reset_for_grading(env, await process_baseline(env))
        except Exception as exc:
            log.warning("control sandbox for %s did not start: %r", self.task_id, exc)
            works = None
        else:
            try:
                await self.run(env, trial_dir)
                works = True
            except VerifierError as exc:
                log.warning("the grader of %s fails on a fresh sandbox: %s", self.task_id, exc)
                works = False
        finally:
            if env is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(env.stop(delete=True), timeout=SANDBOX_STOP_S)
            shutil.rmtree(trial_dir, ignore_errors=True)
        if works is None:
            return False
        self.config.grader_checks[key] = works
        return works
