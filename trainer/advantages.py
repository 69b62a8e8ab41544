"""Group-relative advantages: each rollout's reward against the other rollouts of its task.

    A_i = (r_i - mean(r_valid)) / (std(r_valid) + eps)    with std scaling (scale_rewards=True)
    A_i =  r_i - mean(r_valid)                            without it (Dr. GRPO's choice)

`r_valid` are the rewards of the rollouts that can be scored. A `None` or non-finite reward
(unscorable: the verifier could not tell, the reward function declined) is left out of the mean
and the std and its rollout gets no advantage, so it is never trained. Counting it as 0 would
invent a failure and pull the baseline down for everybody in the group. Infra and verifier failures arrive here
already as `None` (trainer/groups.py counts them by cause).

A group is skipped BEFORE any row is built or forwarded when it cannot give a gradient:
    no_scored       no rollout has a reward
    single_scored   one reward: its advantage would be 0 by construction
    zero_variance   all rewards equal: every advantage is 0
Each skip is counted (`groups/skipped/<reason>`). std is the population std (ddof=0): with 8
rollouts the two differ by 7%, and ddof=0 keeps a 2-rollout group's advantages at exactly +-1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GroupAdvantages", "group_advantages"]

ZERO_VARIANCE_TOL = 1e-12


@dataclass(frozen=True)
class GroupAdvantages:
    advantages: list[float | None]  # per rollout, None = not trained
    skipped: str | None  # None, or "no_scored" | "single_scored" | "zero_variance"
    mean: float | None
    std: float | None
    n_scored: int


def group_advantages(
    rewards: list[float | None], *, scale_rewards: bool = True, eps: float = 1e-4
) -> GroupAdvantages:
    """Advantages for one group's rewards (None = unscorable, excluded from the baseline)."""
    # A non-finite reward is unscorable like None: one NaN would make every advantage NaN.
    # (trainer/rewards.py already turns NaN/inf into None and counts it; this is the last guard.)
    rewards = [None if r is None or not math.isfinite(r) else r for r in rewards]
    valid = [r for r in rewards if r is not None]
    n = len(valid)
    none = [None] * len(rewards)
    if n == 0:
        return GroupAdvantages(none, "no_scored", None, None, 0)
    mean = sum(valid) / n
    std = math.sqrt(sum((r - mean) ** 2 for r in valid) / n)
    if n == 1:
        return GroupAdvantages(none, "single_scored", mean, std, n)
    if std <= ZERO_VARIANCE_TOL:
        return GroupAdvantages(none, "zero_variance", mean, std, n)
    scale = (std + eps) if scale_rewards else 1.0
    advantages = [None if r is None else (r - mean) / scale for r in rewards]
    return GroupAdvantages(advantages, None, mean, std, n)
