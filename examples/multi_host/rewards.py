"""The multi-host rehearsal's reward: 0, 1, 0, 1, ... in the order rollouts finish.

Why not the verifier's reward: the rehearsal checks the plumbing across hosts (weights pushed to
every engine, rollouts through every service), not learning, and a step trains only groups whose
rewards differ. With two rollouts a group, alternating rewards give every whole group variance,
whatever the tiny model samples, so every step trains and pushes a version.
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["alternating"]

_calls = itertools.count()


def alternating(outcome: Any) -> float:
    """0.0 for the first rollout scored in this process, 1.0 for the second, and so on."""
    return float(next(_calls) % 2)
