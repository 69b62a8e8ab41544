"""How long to wait before retrying a failed start-up or rollout: one rule for both processes.

The rollout service's session factory (harness.service.factory) retries infra failures of a
session's start and of a whole rollout; the trainer's client (harness.client.remote) retries a
session a service could not start. Both wait the same way: exponential in the attempt, so a
struggling sandbox host or engine gets room, and jittered by +-20 %, so the many rollouts one
fault failed together do not all return at the same instant and fail together again.
"""

from __future__ import annotations

import random

__all__ = ["backoff_delay"]


def backoff_delay(base_s: float, attempt: int) -> float:
    """Seconds to wait after failed attempt `attempt` (1-based) before the next:
    base_s * 2**(attempt - 1), times a jitter drawn from [0.8, 1.2]."""
    return base_s * 2 ** (attempt - 1) * random.uniform(0.8, 1.2)
