"""Why a rollout failed, as a class: the class IS the cause label the metrics count.

A rollout either ends in a graded, captured result or in one of these errors. The session raises
them; the factory turns each into a `RolloutResult` whose `cause` is the class's `cause`, and
retries only the classes marked `retryable` (infrastructure that failed before the model was
asked anything, so a retry costs no engine time and changes no statistics).

    HarnessError                          (cause: infra_failure)
    ├── InfraError                        infra_failure: the rollout never became a fair sample
    │   ├── SandboxStartError             retryable: the sandbox did not start
    │   ├── ProxyUnreachableError         retryable: the capture proxy refused or timed out
    │   ├── AgentStartError               retryable: the agent exited before its first model call
    │   ├── ProxySessionLostError         the proxy forgot the session mid-run (deleted, restarted)
    │   └── EngineFailureError            the proxy recorded engine/proxy failures of this rollout
    ├── AgentTimeoutError                 timeout: the agent ran past its limit (also TimeoutError)
    └── VerifierError                     verifier_failure: the verifier gave no usable reward
        └── RewardMissingError            no reward.txt / reward.json, or not the selected key

One cause is not an error: `tampered` (the agent kept its grade from being fair: it left state
in the grading paths, filled the disk, killed the grader or the sandbox's pid 1, or the grader
works on a fresh copy of the task but not after it). The session scores such a rollout 0.0 and the factory labels it;
it is trainable and part of its group's baseline, so failing that way costs the policy as
much as failing the task.

What this module refuses to do: classify a failure by reading its message. A foreign error
(Harbor, httpx, bwrap) is translated into one of these classes at the one place that calls the
foreign code (the session), with `raise ... from exc`, so the chain keeps the original.

`AgentTimeoutError` is also a builtin `TimeoutError` because TRL 1.16's `HarnessRolloutWorker`
catches exactly `TimeoutError` around `wait_for_completion()` and then trains the captured turns
with `timed_out` flagged; any other class would make it drop the rollout.
"""

from __future__ import annotations

from typing import ClassVar, Final, Literal

__all__ = [
    "CAUSES",
    "TRAINABLE_CAUSES",
    "AgentStartError",
    "AgentTimeoutError",
    "Cause",
    "EngineFailureError",
    "HarnessError",
    "InfraError",
    "ProxySessionLostError",
    "ProxyUnreachableError",
    "RewardMissingError",
    "SandboxStartError",
    "VerifierError",
    "cause_of",
]

Cause = Literal["ok", "model_failure", "timeout", "tampered", "infra_failure", "verifier_failure"]

# Order is the order metrics print in.
CAUSES: Final[tuple[Cause, ...]] = (
    "ok",
    "model_failure",
    "timeout",
    "tampered",
    "infra_failure",
    "verifier_failure",
)
# A trainable rollout has captured turns a policy produced; the others are counted, never trained
# and never part of a group baseline (a broken sandbox says nothing about the policy).
# `tampered` is trainable: scored 0.0, inside the baseline (leaving it out would reward it).
TRAINABLE_CAUSES: Final[frozenset[Cause]] = frozenset(
    {"ok", "model_failure", "timeout", "tampered"}
)


class HarnessError(Exception):
    """Base of every rollout failure Harness raises on purpose."""

    cause: ClassVar[Cause] = "infra_failure"
    retryable: ClassVar[bool] = False


class InfraError(HarnessError):
    """The machinery around the agent failed; the rollout is not a sample of the policy."""

    cause: ClassVar[Cause] = "infra_failure"


class SandboxStartError(InfraError):
    """The sandbox backend did not start (bwrap missing, task environment broken, quota)."""

    retryable: ClassVar[bool] = True


class ProxyUnreachableError(InfraError):
    """The capture proxy did not answer an admin call (connection refused, timeout, 5xx)."""

    retryable: ClassVar[bool] = True


class AgentStartError(InfraError):
    """The agent exited before it made a single model call: install, config or launch problem.

    Retrying is safe because no engine tokens were spent and nothing was captured.
    """

    retryable: ClassVar[bool] = True


class ProxySessionLostError(InfraError):
    """The proxy no longer knows the session (deleted or restarted) while the agent ran.

    Not retried: the agent already spent engine time, and a vanished session usually means the
    proxy is shutting down, which a retry would only hit again.
    """


class EngineFailureError(InfraError):
    """The capture proxy recorded failed engine or proxy calls (its `failed_calls.infra`) during
    the rollout: whatever the agent did after, its run is no sample of the policy.

    Not retried: the agent already spent engine time, and an engine that fails calls is more
    likely to fail the retry too; it is counted as infra_failure.
    """


class AgentTimeoutError(HarnessError, TimeoutError):
    """The agent ran past its time limit and was stopped. Its captured turns still train."""

    cause: ClassVar[Cause] = "timeout"


class VerifierError(HarnessError):
    """The task's verifier crashed, timed out or wrote an unreadable reward."""

    cause: ClassVar[Cause] = "verifier_failure"


class RewardMissingError(VerifierError):
    """The verifier ran but left no reward (or not the selected reward key)."""


def cause_of(exc: BaseException) -> Cause:
    """The cause label for any exception: ours carry it; anything else is an infra failure.

    An unexpected exception is still counted (as infra_failure) rather than lost; its text goes
    into `RolloutResult.error` so it can be found.
    """
    if isinstance(exc, HarnessError):
        return exc.cause
    return "infra_failure"
