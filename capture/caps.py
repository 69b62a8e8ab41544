"""Per-rollout caps on engine calls and completion tokens, kept by the proxy for every agent.

Why: the agent's session key is readable inside the sandbox, so the policy being trained can fire
model calls of its own (a `curl` loop in one tool call) with prompts of its own choosing. The
step limit (capture.sessions.take_step) counts only calls that offer tools and only for agents
whose own limit is soft; these caps count every call of every agent, aux calls included, so no
rollout can make more engine calls or sample more tokens than its caps, whatever the agent is.

    calls    engine calls started in the session (ok, failed, in flight); the call that would
             pass it is refused
    tokens   completion tokens of the session's recorded calls; once reached, every new call is
             refused (a call in flight may end past it by at most its own max_tokens)

A refused call gets 403 (`RolloutCapReached`, as the step limit: no client retries a 403, so
the agent ends on its own error path), is never sent to the engine nor recorded, and is counted
in the session's stats (`caps.refused`) and in every turn's trace metadata (`rollout_caps`).
The harness sets them per session (`harness.service.session.SessionConfig.rollout_caps`, defaults from
`default_caps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import BadRequest, SessionError

__all__ = ["RolloutCapReached", "RolloutCaps", "default_caps"]


def default_caps(max_steps: int, max_tokens: int | None) -> dict[str, int | None]:
    """The harness's caps for a rollout of `max_steps` steps of at most `max_tokens` completion
    tokens each: room for every step, its retries and aux calls (titles, summaries,
    compactions), and not much more. `max_tokens` None (no cap per call): no token cap."""
    return {"calls": 2 * max_steps + 16,
            "tokens": (max_steps + 8) * max_tokens if max_tokens is not None else None}


class RolloutCapReached(SessionError):
    """A model call past one of its session's rollout caps (capture.caps)."""

    status = 403

    def __init__(self, session_id: str, what: str, limit: int) -> None:
        self.what = what
        super().__init__(
            f"session {session_id[:80]} has reached its rollout cap of {limit} {what} "
            "(capture.caps): no further model call is served in this rollout")


@dataclass
class RolloutCaps:
    """One session's caps and what they counted."""

    calls: int | None = None
    tokens: int | None = None
    tokens_used: int = 0  # completion tokens of the session's recorded calls
    refused: int = 0  # calls refused past a cap
    refused_by: dict[str, int] | None = None

    @classmethod
    def from_dict(cls, caps: Any) -> RolloutCaps:
        """Validate a session's `caps` ({"calls"?: int|null, "tokens"?: int|null}, or null)."""
        if caps is None:
            return cls()
        if not isinstance(caps, dict) or set(caps) - {"calls", "tokens"}:
            raise BadRequest('caps must be {"calls": int or null, "tokens": int or null}, got '
                             f"{caps!r:.200}")
        for key, value in caps.items():
            if value is not None and (type(value) is not int or value < 1):
                raise BadRequest(f"caps.{key} must be a whole number >= 1 or null, got {value!r}")
        return cls(calls=caps.get("calls"), tokens=caps.get("tokens"))

    def check(self, session_id: str, calls_started: int) -> None:
        """Raise RolloutCapReached (and count it) for a call that would pass a cap;
        `calls_started`: the session's calls so far, this one not included."""
        what = limit = None
        if self.calls is not None and calls_started >= self.calls:
            what, limit = "engine calls", self.calls
        elif self.tokens is not None and self.tokens_used >= self.tokens:
            what, limit = "completion tokens", self.tokens
        if what is None or limit is None:
            return
        self.refused += 1
        self.refused_by = self.refused_by or {}
        self.refused_by[what] = self.refused_by.get(what, 0) + 1
        raise RolloutCapReached(session_id, what, limit)

    def limits(self) -> dict[str, int | None]:
        return {"calls": self.calls, "tokens": self.tokens}

    def stats(self, calls_started: int) -> dict[str, Any]:
        return {"calls": self.calls, "tokens": self.tokens, "calls_used": calls_started,
                "tokens_used": self.tokens_used, "refused": self.refused,
                "refused_by": dict(self.refused_by or {})}
