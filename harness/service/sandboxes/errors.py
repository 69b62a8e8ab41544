"""What can go wrong with a sandbox, as one tree (the class is the cause the metrics count).

    SandboxError
    ├── SandboxUnavailableError      the backend cannot run on this host (bwrap missing, ...)
    ├── SandboxDefinitionError       the task's environment/ asks for what the backend cannot do
    ├── SandboxStartError            the sandbox process did not come up
    ├── SandboxClosedError           an operation on a sandbox that was stopped or never started
    ├── SandboxExecError             the command channel broke (not: the command failed)
    │   ├── SandboxExecTimeoutError  the command ran past its deadline and was killed
    │   └── SandboxDiedError         the sandbox's pid 1 died without our asking: the agent's
    │                                doing (nothing else runs in there), so the session scores it
    ├── SandboxPathError             a path the sandbox cannot read or write (read-only bind, ...)
    └── ExposeError                  the proxy cannot be made reachable from a remote sandbox

A command that exits non-zero is not an error: it is an ExecResult with its return code.
SandboxExecTimeoutError subclasses RuntimeError too, because Harbor's own environments raise a
plain RuntimeError on an exec timeout and Harbor code catches that.
"""

from __future__ import annotations

__all__ = [
    "ExposeError",
    "SandboxClosedError",
    "SandboxDefinitionError",
    "SandboxDiedError",
    "SandboxError",
    "SandboxExecError",
    "SandboxExecTimeoutError",
    "SandboxPathError",
    "SandboxStartError",
    "SandboxUnavailableError",
]


class SandboxError(Exception):
    """Base of every sandbox failure (an infrastructure failure, never the model's)."""


class SandboxUnavailableError(SandboxError):
    """The backend cannot run on this host; the message names what to install or set."""


class SandboxDefinitionError(SandboxError):
    """The task's environment definition uses something this backend does not support."""


class SandboxStartError(SandboxError):
    """The sandbox process failed to start or to report ready."""


class SandboxClosedError(SandboxError):
    """The sandbox was stopped (or never started) when an operation needed it."""


class SandboxExecError(SandboxError):
    """The command channel to the sandbox broke; the command's own exit code is not this."""


class SandboxExecTimeoutError(SandboxExecError, RuntimeError):
    """The command ran past its deadline; its whole process group was killed."""

    def __init__(self, message: str, *, timeout_s: float, stdout: str = "", stderr: str = ""):
        super().__init__(message)
        self.timeout_s = timeout_s
        self.stdout = stdout
        self.stderr = stderr


class SandboxDiedError(SandboxExecError):
    """The sandbox's pid 1 (its supervisor) exited while nobody on the host had stopped it.

    Only the agent's processes run beside it, and it outlives anything they can send it
    (signals, floods of connections, exhausted descriptors): the session scores such a rollout
    `tampered` (0.0, inside the baseline), never infra_failure (issue 29). `status` is bwrap's
    exit status, `log_tail` the end of the supervisor's log (host-side: out of the agent's reach).
    """

    def __init__(self, message: str, *, status: int | None = None, log_tail: str = ""):
        super().__init__(message)
        self.status = status
        self.log_tail = log_tail


class SandboxPathError(SandboxError):
    """A sandbox path cannot be written or read (read-only bind, outside the sandbox)."""


class ExposeError(SandboxError):
    """The capture proxy cannot be exposed to a remote sandbox as configured."""
