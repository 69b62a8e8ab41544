"""The session's sampling policy, enforced on every engine call whatever the agent asked for.

The trainer owns the behaviour policy. Agents send their own knobs (opencode a temperature,
Claude Code `temperature: 1`, some SDKs `top_p: 0.95`), and vLLM's processed logprobs are taken
AFTER truncation and penalties: a `top_p` of 0.95 renormalises every captured logprob, so GRPO's
first importance ratio is the kept mass instead of 1 (OpenEnv measured this on vLLM; see its
`NON_POLICY_SAMPLING`). So every call is rewritten to the session's policy, and what was changed is
recorded on the call (`sampling` metadata: the applied policy and the agent's overridden values).

A session created without a policy gets the neutral training policy at temperature 1.0: the proxy
exists to produce training data, and a silent top_p from an agent's defaults is the bug this module
prevents. Pass `{"temperature": t, ...}` to choose another; any knob may be set explicitly (an eval
session may want top_p 0.95), it is then enforced just the same.

Seeds (issue 32, reproducible runs): a policy may carry `seed`, the rollout's sampling seed (the
harness derives it from the run's --seed, the task and the rollout's place in its group or
evaluation: harness.service.session). Every engine call of the session then carries vLLM's per-request
`seed`, `call_seed(seed, n)` for its call number n (1, 2, ... in the order the session's calls
reach the engine), so the same rollout samples the same tokens in a second run and no two calls
of a rollout share a random stream (an agent that retries a call does not get the same reply by
construction). The agent cannot choose it: capture.allowlist drops any `seed` the request carries
(counted) and the proxy writes its own after. Without `seed` the engine draws its own randomness,
as before. The seed sent is recorded with the call (`sampling.seed`).

This module refuses to guess: unknown keys, non-numbers and out-of-range values raise ValueError
with the field named, at session creation, never mid-rollout.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

__all__ = ["MAX_SEED", "NEUTRAL_POLICY", "SamplingPolicy", "call_seed"]

# vLLM takes a per-request seed in int64; derived seeds stay in [0, 2**63).
MAX_SEED = (1 << 63) - 1


def call_seed(seed: int, call_number: int) -> int:
    """The engine seed of a session's `call_number`-th call (1-based) under rollout seed `seed`:
    a hash, so neighbouring calls and neighbouring rollouts get unrelated random streams."""
    digest = hashlib.blake2b(f"call:{seed}:{call_number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest) >> 1

# The value that disables each knob in vLLM. top_k: vLLM takes -1 (and 0) as "off".
NEUTRAL_POLICY: dict[str, float | int] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}

_RANGES: dict[str, tuple[float, float]] = {
    "temperature": (0.0, 100.0),
    "top_p": (1e-9, 1.0),
    "top_k": (-1, 1 << 30),
    "min_p": (0.0, 1.0),
    "frequency_penalty": (-2.0, 2.0),
    "presence_penalty": (-2.0, 2.0),
    "repetition_penalty": (1e-9, 100.0),
}


class SamplingPolicy:
    """Validated knobs plus an optional `max_tokens` cap and rollout `seed`. `enforce` rewrites
    one chat request; `seed_for(n)` is its engine seed once it is the session's n-th call."""

    __slots__ = ("knobs", "max_tokens", "seed")

    def __init__(self, knobs: dict[str, float | int], max_tokens: int | None,
                 seed: int | None = None) -> None:
        self.knobs = knobs
        self.max_tokens = max_tokens
        self.seed = seed

    @classmethod
    def from_dict(cls, sampling: dict[str, Any] | None) -> SamplingPolicy:
        """Validate a session's sampling dict (OpenEnv `training_sampling` shape + `max_tokens`)."""
        if sampling is None:
            return cls(dict(NEUTRAL_POLICY), None)
        if not isinstance(sampling, dict):
            raise ValueError("sampling must be a JSON object such as {'temperature': 1.0}")
        unknown = set(sampling) - set(NEUTRAL_POLICY) - {"max_tokens", "seed"}
        if unknown:
            raise ValueError(
                f"unknown sampling fields {sorted(unknown)}; allowed: "
                f"{sorted([*NEUTRAL_POLICY, 'max_tokens', 'seed'])}"
            )
        knobs = dict(NEUTRAL_POLICY)
        for key, value in sampling.items():
            if key in ("max_tokens", "seed"):
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"sampling {key} must be a number, got {value!r}")
            low, high = _RANGES[key]
            if not math.isfinite(value) or not low <= value <= high:
                raise ValueError(f"sampling {key}={value!r} is outside [{low}, {high}]")
            if key == "top_k":
                if int(value) != value:
                    raise ValueError(f"sampling top_k must be an integer, got {value!r}")
                # 0 and -1 both mean "off"; vLLM 0.32 takes -1 (and 0) so keep -1 canonical.
                knobs[key] = -1 if value in (0, -1) else int(value)
            else:
                knobs[key] = float(value)
        cap = sampling.get("max_tokens")
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise ValueError(f"sampling max_tokens must be a positive integer, got {cap!r}")
        seed = sampling.get("seed")
        if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):
            raise ValueError(f"sampling seed must be an integer in [0, 2**63), got {seed!r}")
        return cls(knobs, cap, seed)

    def as_dict(self) -> dict[str, Any]:
        return {**self.knobs, "max_tokens": self.max_tokens, "seed": self.seed}

    def seed_for(self, call_number: int) -> int | None:
        """The engine seed of the session's `call_number`-th call; None without a rollout seed."""
        return None if self.seed is None else call_seed(self.seed, call_number)

    def enforce(self, chat: dict[str, Any]) -> dict[str, Any]:
        """Rewrite `chat` in place to this policy; return what was enforced for the call record.

        Returned shape: `{"policy": {...}, "overridden": {knob: agent_value}, "max_tokens":
        {"requested": n|None, "sent": n|None}}` so a reader sees both what the engine sampled with
        and what the agent had asked for.
        """
        overridden: dict[str, Any] = {}
        for key, value in self.knobs.items():
            asked = chat.get(key)
            if asked is not None and asked != value:
                overridden[key] = asked
            chat[key] = value
        requested = chat.pop("max_completion_tokens", None)
        if chat.get("max_tokens") is not None:
            requested = chat["max_tokens"]
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            requested = None
        sent = requested
        if self.max_tokens is not None and (sent is None or sent > self.max_tokens):
            sent = self.max_tokens
        if sent is None:
            chat.pop("max_tokens", None)  # vLLM then uses what is left of the context
        else:
            chat["max_tokens"] = sent
        # One choice per call: the graph holds one completion per engine call.
        if chat.get("n") not in (None, 1):
            overridden["n"] = chat["n"]
        chat["n"] = 1
        return {
            "policy": dict(self.knobs),
            "overridden": overridden,
            "max_tokens": {"requested": requested, "sent": sent},
        }
