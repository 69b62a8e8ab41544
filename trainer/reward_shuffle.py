"""The shuffled-reward control's permutations: balanced (the default) or uniform.

The control trains on each group's rewards permuted among its rollouts, so the rewards no longer
say which rollout did well; a loop that still learns from them has a bug. A uniform permutation
of a few rewards says it anyway, a little, by chance: with 8 rollouts a group, the permuted
rewards' correlation with the earned ones has an SD of ~0.38, and over a run's ~44 groups the sum
does not cancel. Measured on issue 32's lookup family (2026-12-04), five shuffled runs, 12 steps
each: the sum over groups of `advantage x (earned reward - group mean)` had the sign of the run's
pass-rate change every time (+12.3 -> +10.4 points, -4.9 -> -24.0, +15.5 -> +14.6, -13.4 ->
-16.7, +18.6 -> +13.5; the four real runs' sums were +135 to +154). So a uniform shuffle is not a zero-signal
control at this size: it is a real run with a random-signed reward of a tenth the strength.

Balanced: each group still gets a permutation of its own rewards (same multiset, same advantage
magnitudes), drawn from `candidates` seeded ones, but the one that brings the run's running sum
of that signal closest to zero. The sum then stays within about one group's signal of zero for
the whole run, instead of wandering like a random walk. The permutation depends on the true
rewards only through that one number, and only to cancel it.

Measured with it, the same 12 steps at learning rate 5e-4 on the test split: seeds 0-3 changed
+10.4, +3.1, -2.1 and -3.1 points (net signal -0.7 to -1.0), where uniform permutations at seeds
0-2 changed +10.4, -24.0 and +14.6 (net signal +12.3, -4.9, +15.5); on dev, seeds 0-2: +8.3,
-1.0, -11.5. So the chance signal was a large part of the drift, not all of it: what is left, up
to ~10 points, moved in no signal's direction (an optimizer stepping on rewards that carry no
information still moves the policy; Adam's step does not shrink with the gradient's size).

What balanced does not do: keep the same permutations from run to run when groups finish in a
different order (the running sum is taken in the order groups are prepared, which async rollouts
decide), or carry the sum across a resume (a resumed run starts it again at zero). Each group's
record keeps its earned rewards (`reward_unshuffled`) and its signal, so a run can be audited.
"""

from __future__ import annotations

import random
import statistics
import threading
from collections.abc import Sequence
from typing import Literal

__all__ = ["SHUFFLE_MODES", "RewardShuffle", "shuffle_signal"]

ShuffleMode = Literal["balanced", "uniform"]
SHUFFLE_MODES: tuple[str, ...] = ("balanced", "uniform")


def shuffle_signal(earned: Sequence[float], paid: Sequence[float]) -> float:
    """How far training on `paid` pushes toward the rollouts that `earned` high rewards:
    sum of (paid - mean) x (earned - mean) / std, i.e. sum of a scaled advantage times the
    centred earned reward. 0 when the group has no spread."""
    mean = statistics.fmean(earned)
    std = statistics.pstdev(earned)
    if std == 0:
        return 0.0
    return sum((p - mean) * (e - mean) for p, e in zip(paid, earned, strict=True)) / std


class RewardShuffle:
    """One per run: permutes each group's rewards. Thread-safe (groups are prepared in the
    producer's threads)."""

    def __init__(self, seed: int, mode: ShuffleMode = "balanced", candidates: int = 64) -> None:
        if mode not in SHUFFLE_MODES:
            raise ValueError(f"shuffle mode {mode!r}: must be one of {', '.join(SHUFFLE_MODES)}")
        self.seed = seed
        self.mode = mode
        self.candidates = candidates
        self.net_signal = 0.0  # the run's running sum of shuffle_signal over its groups
        self._lock = threading.Lock()

    def permute(self, group_index: int, earned: Sequence[float]) -> tuple[list[float], float]:
        """`earned` reordered among its positions, and that order's `shuffle_signal`."""
        rng = random.Random(f"{self.seed}:{group_index}")
        values = list(earned)
        rng.shuffle(values)
        with self._lock:
            if self.mode == "balanced":
                best = list(values)
                best_gap = abs(self.net_signal + shuffle_signal(earned, values))
                for _ in range(self.candidates - 1):
                    rng.shuffle(values)
                    gap = abs(self.net_signal + shuffle_signal(earned, values))
                    if gap < best_gap:
                        best, best_gap = list(values), gap
                values = best
            signal = shuffle_signal(earned, values)
            self.net_signal += signal
        return values, signal
