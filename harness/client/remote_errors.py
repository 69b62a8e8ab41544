"""How a rollout service's failures become `harness.shared.errors` classes on the trainer's side.

Why it exists: the service answers a failed session call with a 422 naming the error's class, and
the trainer's metrics count failures by that class, so the client must raise the same class the
service raised, without importing the service (or capture, whose NothingTrainableError it
mirrors by name). Both the rollout client and the remote session read errors through here.
"""

from __future__ import annotations

from typing import Any

import httpx

from harness.shared.errors import (
    AgentStartError,
    AgentTimeoutError,
    Cause,
    EngineFailureError,
    HarnessError,
    InfraError,
    ProxySessionLostError,
    ProxyUnreachableError,
    RewardMissingError,
    SandboxStartError,
    VerifierError,
)

__all__ = ["NothingTrainableError", "ServiceLostError", "error_of", "raise_remote"]


class ServiceLostError(InfraError):
    """A rollout service stopped answering (refused, reset, timed out or forgot) mid-rollout."""


# The classes a service names in its 422 answers; anything else is an InfraError.
_ERRORS: dict[str, type[HarnessError]] = {c.__name__: c for c in (
    InfraError, SandboxStartError, AgentStartError, ProxySessionLostError, EngineFailureError,
    ProxyUnreachableError, AgentTimeoutError, VerifierError, RewardMissingError, HarnessError)}


class _RemoteError(InfraError):
    """A service's failure whose class is not known here; keeps its cause and retry flag."""

    def __init__(self, message: str, cause: Cause, retryable: bool) -> None:
        super().__init__(message)
        self._cause, self._retryable = cause, retryable

    @property
    def cause(self) -> Cause:  # type: ignore[override]
        return self._cause

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        return self._retryable


def raise_remote(error: dict[str, Any], url: str) -> None:
    """Raise the class the service named, so the trainer counts the failure as the service did."""
    name, message = str(error.get("type")), f"[{url}] {error.get('message')}"
    cls = _ERRORS.get(name)
    if cls is not None:
        raise cls(message)
    if name == "NothingTrainableError":
        raise NothingTrainableError(message)
    if error.get("timeout"):
        raise AgentTimeoutError(message)
    raise _RemoteError(f"{name}: {message}", error.get("cause") or "infra_failure",
                       bool(error.get("retryable")))


class NothingTrainableError(ValueError):
    """The service's capture held nothing trainable (trainer/ matches it by name, as capture's)."""


def error_of(response: httpx.Response) -> dict[str, Any]:
    """A failed answer's `error` object, or one made of its status and body when it has none."""
    try:
        return dict(response.json().get("error") or {})
    except ValueError:
        return {"type": "HTTPError", "message": f"HTTP {response.status_code}: "
                f"{response.text[:500]}"}

