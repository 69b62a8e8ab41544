"""Rewards: what a rollout is worth, from the verifier or from the user's functions.

    rollout_reward_fn(outcome) -> float | None      the seed API (one function)
    reward_funcs=[fn, RewardFunc("name", fn, weight), ...]   several, each logged separately

The total is the weighted sum of every function's value (the rollout_reward_fn counts as one
function named after itself, weight 1). Without any function, the verifier's `env_reward` is the
reward as is. This module never invents a number:

- a function returning None makes the rollout unscorable (left out of its group's baseline);
- a function that raises, or returns something that is not a finite number (a string, a bool,
  NaN), is a *reward failure*: reported by the function's name, counted
  (`rollouts/cause/reward_failure`, `rewards/<name>/failures`), and the rollout is unscorable.
  A verifier `env_reward` that is not a finite number is the same failure, named `env_reward`
  (a NaN reward would otherwise make every advantage of its group NaN).
  One bad reward function must not crash a run that has spent hours on rollouts, and must not
  score a rollout 0 either.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ENV_REWARD", "RewardFunc", "RewardResult", "normalize_reward_funcs", "score_rollout"]

log = logging.getLogger(__name__)
ENV_REWARD = "env_reward"


@dataclass(frozen=True)
class RewardFunc:
    """A named, weighted reward function of a rollout outcome."""

    name: str
    fn: Callable[[Any], float | None]
    weight: float = 1.0


@dataclass
class RewardResult:
    total: float | None  # None: unscorable (excluded from the baseline)
    parts: dict[str, float | None] = field(default_factory=dict)  # per function, as returned
    failure: str | None = None  # "name: what went wrong" when a function failed


def normalize_reward_funcs(
    rollout_reward_fn: Callable | None, reward_funcs: Sequence[Callable | RewardFunc] | None
) -> list[RewardFunc]:
    """One list of RewardFunc; names must be unique (they become metric names)."""
    funcs: list[RewardFunc] = []
    if rollout_reward_fn is not None:
        funcs.append(RewardFunc(getattr(rollout_reward_fn, "__name__", "rollout_reward"),
                                rollout_reward_fn))
    for f in reward_funcs or ():
        if isinstance(f, RewardFunc):
            funcs.append(f)
        elif callable(f):
            funcs.append(RewardFunc(getattr(f, "__name__", f"reward_{len(funcs)}"), f))
        else:
            raise TypeError(f"reward_funcs entry {f!r} is neither callable nor a RewardFunc")
    names = [f.name for f in funcs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"reward function names must be unique, repeated: {dupes}; wrap them "
                         "as RewardFunc('a_name', fn) to name them apart")
    return funcs


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"returned {type(value).__name__} {value!r}, expected a float or None")
    if not math.isfinite(value):
        raise ValueError(f"returned a non-finite number {value!r}")
    return float(value)


def score_rollout(outcome: Any, env_reward: float | None, funcs: list[RewardFunc]) -> RewardResult:
    """Score one rollout. Never raises for a reward function's fault: see the module docstring."""
    if not funcs:
        if env_reward is None:
            return RewardResult(None, {ENV_REWARD: None})
        try:
            value = _as_number(env_reward)
        except (TypeError, ValueError) as exc:  # a verifier that wrote NaN, inf or a string
            log.warning("env_reward %r is not a finite number: rollout unscorable", env_reward)
            return RewardResult(None, {ENV_REWARD: None}, f"{ENV_REWARD}: {exc}")
        return RewardResult(value, {ENV_REWARD: value})
    parts: dict[str, float | None] = {}
    total: float | None = 0.0
    for f in funcs:
        try:
            value = f.fn(outcome)
            value = None if value is None else _as_number(value)
        except Exception as exc:  # the user's code: report by name, never crash the run
            log.warning("reward function %r failed: %s", f.name, exc, exc_info=True)
            return RewardResult(None, parts, f"{f.name}: {type(exc).__name__}: {exc}")
        parts[f.name] = value
        total = None if (value is None or total is None) else total + f.weight * value
    return RewardResult(total, parts)
