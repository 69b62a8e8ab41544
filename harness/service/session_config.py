"""What every session of one factory shares: how to build its sandbox, and its settings.

Why it exists: the factory builds these once and hands them to each `HarborSession`; the grading
code (session_grading) builds a control sandbox from them too. Kept apart from the session's
lifecycle so the factory, the grader and test backends read the settings without it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.service.agents.base import HarnessAgent
    from harness.service.proxy_link import ProxyLink

__all__ = ["SANDBOX_STOP_S", "SandboxBackend", "SandboxRequest", "SessionConfig"]

SANDBOX_STOP_S = 30.0  # a sandbox stop past this is logged and skipped (close goes on)


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
