"""Sandboxes: where an agent runs. A local bubblewrap one, and Harbor's remote backends.

    BwrapEnvironment  Harbor `BaseEnvironment` on bubblewrap (bwrap.py); import path
                      "harness.service.sandboxes.bwrap:BwrapEnvironment". Imports Harbor when first used.
    BwrapSandbox      the same sandbox without Harbor types (local.py)
    GradingReset      what `prepare_grading()` killed and found before a verifier
                      (local_pid1_ops.py, the type in grading_state.py);
                      grading.py does the same through `exec` for Harbor's other backends
    SandboxSpec, SandboxLimits, sandbox_url, url_forward, resolved_tool_binds, venv_binds
    SANDBOX_BACKENDS, environment_config, ProxyExposure, expose_proxy   (expose.py)

The threat model (what each backend guarantees about grading, and what it does not) is in
bwrap.py ("What is covered" / "What is not covered"); the supervisor protocol is in
supervisor.py.
"""

from typing import Any

from harness.service.sandboxes.errors import (
    ExposeError,
    SandboxClosedError,
    SandboxDefinitionError,
    SandboxDiedError,
    SandboxError,
    SandboxExecError,
    SandboxExecTimeoutError,
    SandboxPathError,
    SandboxStartError,
    SandboxUnavailableError,
)
from harness.service.sandboxes.expose import (
    SANDBOX_BACKENDS,
    ProxyExposure,
    Tunnel,
    environment_config,
    expose_proxy,
)
from harness.service.sandboxes.limits import SandboxLimits, process_cap_mode
from harness.service.sandboxes.local import (
    BASE_ENV,
    BwrapSandbox,
    GradingReset,
    SandboxSpec,
)
from harness.service.sandboxes.local_launch import check_bwrap_available
from harness.service.sandboxes.mounts import resolved_tool_binds, venv_binds
from harness.service.sandboxes.ports import sandbox_url, url_forward

__all__ = [
    "BASE_ENV",
    "SANDBOX_BACKENDS",
    "BwrapEnvironment",
    "BwrapSandbox",
    "ExposeError",
    "GradingReset",
    "ProxyExposure",
    "SandboxClosedError",
    "SandboxDefinitionError",
    "SandboxDiedError",
    "SandboxError",
    "SandboxExecError",
    "SandboxExecTimeoutError",
    "SandboxLimits",
    "SandboxPathError",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxUnavailableError",
    "Tunnel",
    "check_bwrap_available",
    "environment_config",
    "expose_proxy",
    "process_cap_mode",
    "resolved_tool_binds",
    "sandbox_url",
    "url_forward",
    "venv_binds",
]


def __getattr__(name: str) -> Any:
    # BwrapEnvironment subclasses Harbor's BaseEnvironment: import Harbor only when asked for it.
    if name == "BwrapEnvironment":
        from harness.service.sandboxes.bwrap import BwrapEnvironment

        return BwrapEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
