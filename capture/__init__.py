"""The capture proxy: agents talk to it as their model provider; it records what the engine sampled.

An agent (opencode, Claude Code, Codex, mini-swe-agent) is pointed at a per-session base URL with
the session secret as its API key. Each call is translated from the agent's dialect (capture.
dialects) to a vLLM chat completion, rewritten to the session's sampling policy, forwarded, and
answered in the agent's own wire format (streamed as the engine streams). The engine's prompt ids,
sampled ids and logprobs are recorded per call, linked into a rollout graph by exact token prefix,
and exported as an `openenv.core.harness.training.TrainingTrace`.

    capture.server.CaptureServer     the proxy in-process (uvicorn thread); `python -m capture`
    capture.serving                  uvicorn through its public interface, on a socket bound first
    capture.client.CaptureClient     admin API client (+ AsyncCaptureClient)
    capture.errors                   the exception tree (upstream vs session vs bad input)
    capture.graph / aux / export     rollout graph, aux tagging, TrainingTrace export
    capture.upstream                 the engine leg: vLLM's chat route, one tuned aiohttp session
    capture.resent                   a resent history is neither parsed nor serialised again
    capture.early                    a resent chat call leaves for the engine before its translation
    capture.fake_engine              a fast fake vLLM for tests, fault injection and the benchmark
    capture.allowlist                what of an agent's request may reach the engine (the rest is
                                     dropped and counted: the engine samples under the policy)
    capture.guard                    safe on a public port: every check of a request's head, its
                                     read times and its bounds, in one place
    capture.calllog                  the per-session log: fsync policy, torn lines cost themselves

What the room refuses: tokenizing anything (ids come from the engine), scoring anything (rewards
are the verifier's), and importing torch or harbor (it runs on its own, light, on any host).
"""

from __future__ import annotations

from .caps import RolloutCapReached, RolloutCaps
from .client import AsyncCaptureClient, CaptureClient, SessionInfo
from .errors import (
    BadRequest,
    BadSessionKey,
    CaptureError,
    NothingTrainableError,
    StepLimitReached,
    UnknownSession,
    UpstreamError,
)
from .server import CaptureServer

__all__ = [
    "AsyncCaptureClient",
    "BadRequest",
    "BadSessionKey",
    "CaptureClient",
    "CaptureError",
    "CaptureServer",
    "NothingTrainableError",
    "RolloutCapReached",
    "RolloutCaps",
    "SessionInfo",
    "StepLimitReached",
    "UnknownSession",
    "UpstreamError",
]
