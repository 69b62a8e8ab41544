"""Every way a capture call can fail, as one tree. The class is the cause label metrics count.

    CaptureError
     ├── UpstreamError                  the engine failed us; the agent gets an error, the call is
     │    │                             recorded as failed (never trainable), the proxy keeps serving
     │    ├── EngineUnreachable         connection refused / reset / DNS
     │    ├── EngineTimeout             no answer (or no next chunk) within the timeout
     │    ├── EngineHTTPError           the engine answered non-2xx (.status, .body)
     │    ├── EngineDisconnected        the stream ended before the engine said [DONE]
     │    └── EngineNoTokenIds          a 200 reply without prompt_token_ids / token_ids: the engine
     │                                  runs without --return-tokens-as-token-ids
     ├── SessionError                   the caller, not the engine, is wrong
     │    ├── UnknownSession            no session with that id (404)
     │    └── BadSessionKey             missing or wrong secret / admin key (401); never recorded
     │    └── StepLimitReached          a call that offers tools past the session's step limit
     │                                  (403); counted, never recorded, never sent on
     ├── AgentDisconnected              the agent hung up mid-stream; its partial call is failed
     ├── BadRequest                     the agent's body cannot be served (4xx, never recorded):
     │                                  malformed JSON, wrong content type, oversized body, a body the
     │                                  dialect rejects
     └── NothingTrainableError          export found no turn with a trainable token (.reasons);
                                        HTTP 409 rather than an empty trace

Upstream errors are runtime conditions of the engine; session errors and bad requests are the
caller's mistakes and are answered with 4xx. The split matters for the harness: an upstream failure
is infra (retry the rollout), a 4xx is the agent misbehaving (a model failure).
"""

from __future__ import annotations

__all__ = [
    "AgentDisconnected",
    "BadRequest",
    "BadSessionKey",
    "CaptureError",
    "EngineDisconnected",
    "EngineHTTPError",
    "EngineNoTokenIds",
    "EngineTimeout",
    "EngineUnreachable",
    "NothingTrainableError",
    "SessionError",
    "StepLimitReached",
    "UnknownSession",
    "UpstreamError",
]


class CaptureError(Exception):
    """Base of every capture failure. `status` is the HTTP status the proxy answers with."""

    status: int = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UpstreamError(CaptureError):
    """The engine did not give us a usable reply. The agent sees 502 (or 504 for timeouts)."""

    status = 502


class EngineUnreachable(UpstreamError):
    """Connection refused, reset or unresolvable: the engine is down or the URL is wrong."""


class EngineTimeout(UpstreamError):
    """The engine did not answer (or stopped streaming) within the proxy's timeout."""

    status = 504


class EngineHTTPError(UpstreamError):
    """The engine answered with a non-2xx status; 4xx statuses are passed on to the agent."""

    def __init__(self, status: int, body: object) -> None:
        detail = body
        if isinstance(body, dict):
            error = body.get("error", body)
            detail = error.get("message", error) if isinstance(error, dict) else error
        super().__init__(f"engine returned HTTP {status}: {str(detail)[:500]}")
        self.engine_status = status
        self.body = body
        # A 4xx from the engine is about the request (e.g. context too long): the agent must see it
        # as its own error, with the same status, so it can react (compact, shorten). 5xx -> 502.
        self.status = status if 400 <= status < 500 else 502


class EngineDisconnected(UpstreamError):
    """The engine's stream ended (or broke) before `[DONE]`: the reply is incomplete."""


class EngineNoTokenIds(UpstreamError):
    """A successful reply that carries no token ids: nothing in it can ever be trained on."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"the engine reply has no {what}. Serve vLLM with --return-tokens-as-token-ids "
            "--logprobs-mode processed_logprobs (launchers.engine.Engine does) so every call "
            "carries prompt_token_ids, choices[0].token_ids and logprobs."
        )


class SessionError(CaptureError):
    """The caller named a session it cannot use."""


class StepLimitReached(SessionError):
    """The agent asked for a step past its session's step limit (capture.sessions.take_step).

    403, not 429: no client retries it, so the agent ends at its own error path, and the harness
    stops it when it sees the refusal counted (harness.service.session)."""

    status = 403

    def __init__(self, session_id: str, limit: int) -> None:
        super().__init__(
            f"session {session_id[:80]} has taken its {limit} step(s) (model calls that offer "
            "tools): the rollout's step limit; no further step is served")


class UnknownSession(SessionError):
    """No session with this id lives on this proxy."""

    status = 404

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"no capture session {session_id[:80]!r} on this proxy; create one with "
            "POST /admin/sessions (capture.client.CaptureClient.create_session)"
        )


class BadSessionKey(SessionError):
    """Missing or wrong key. Agent calls with it are answered 401 and never recorded."""

    status = 401


class AgentDisconnected(CaptureError):
    """The agent closed its connection before the streamed reply ended (its call is failed)."""

    status = 499


class BadRequest(CaptureError):
    """The request body cannot be served as sent. Answered 4xx, never recorded."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class NothingTrainableError(CaptureError):
    """The session holds no turn with a trainable token. `reasons` says why, one line per cause."""

    status = 409

    def __init__(self, session_id: str, reasons: list[str]) -> None:
        joined = "; ".join(reasons) if reasons else "no engine calls were recorded"
        super().__init__(f"session {session_id} has nothing trainable: {joined}")
        self.session_id = session_id
        self.reasons = list(reasons)
