"""What every part of the proxy shares: its bounds (`Limits`) and its state (`CaptureState`).

A module of its own so that the app (which builds the state), the guard (which reads the bounds)
and the agent routes (which use the state) each import it and none imports another for it: the
three used to form an import circle through `capture.app`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engines import EnginePool
    from .sessions import SessionStore

__all__ = ["CaptureState", "Limits"]


@dataclass(frozen=True)
class Limits:
    """The proxy's bounds on what a peer can hold (module docstring)."""

    max_connections: int = 2048
    header_timeout_s: float = 30.0
    body_timeout_s: float = 120.0
    max_header_bytes: int = 64 * 1024
    max_body_bytes: int = 32 * 1024 * 1024
    max_session_bytes: int = 512 * 1024 * 1024
    max_session_requests: int = 64
    max_session_body_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("max_connections", "header_timeout_s", "body_timeout_s", "max_header_bytes",
                     "max_body_bytes", "max_session_bytes", "max_session_requests",
                     "max_session_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")


@dataclass
class CaptureState:
    """Everything the routes share. One per proxy; lives on `app.state.capture`."""

    engines: EnginePool  # one or more engines; `engines.engine_for(session_id)` per call
    store: SessionStore
    admin_key: str
    limits: Limits = field(default_factory=Limits)
    weight_version: int = 0
    # The engine model name serving `weight_version` when it is not the engine's own (a LoRA
    # run's adapter `<base>-lora-v<N>`, trainer/weight_sync/lora.py); None: the served model.
    # Set together with the version and read together with it when a call starts, so a call
    # stamped version N names adapter N.
    engine_model: str | None = None
    dialect_crashes: int = 0
    public_url: str | None = None
    # The local port admin routes are served on, when not every listener serves them (guard).
    admin_port: int | None = None
    agent_url: str | None = None  # the public listener's URL, when admin has its own
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def max_body_bytes(self) -> int:
        return self.limits.max_body_bytes
