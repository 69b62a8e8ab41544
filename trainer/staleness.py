"""Staleness: how many policy versions a token lags the policy it trains, and the rule for it.

    staleness(token) = policy_version_now - version_start(token)

`version_start` is the engine's weight version when the sampling call began (capture metadata),
so a turn that straddled an update counts from its older half. Two mechanisms bound it:

1. Admission (in the producer, trainer/loop.py): group g is dispatched only while
   g // groups_per_step <= steps_done + max_staleness, so with a weight sync that keeps up no
   token can be consumed more than `max_staleness` versions after it was sampled.
2. This check, at consumption: the engine's real version can lag the trainer's (no weight sync,
   a slow sync, a resumed run on an old engine), and the capture's stamp is the truth. Trainable
   tokens older than the bound follow `staleness_rule`:
     "correct"  train them; the truncated IS weight min(pi_theta/mu, C) corrects them (loss.py)
     "drop"     mask them to context (mask 0); the row still gives them as context
   Either way they are counted (`staleness/over_bound_tokens`), never silently trained.

Tokens within the bound always train with the same IS correction: staleness and train/inference
mismatch are one off-policy gap to the trainer, both measured against the behaviour logprobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import compress

from trainer.rows import Row

__all__ = ["StalenessStats", "apply_staleness"]


@dataclass
class StalenessStats:
    trainable_tokens: int = 0
    stale_tokens: int = 0  # staleness >= 1 (IS-corrected)
    over_bound_tokens: int = 0  # staleness > max_staleness
    dropped_tokens: int = 0  # over bound and dropped by rule "drop"
    staleness_sum: int = 0
    staleness_max: int = 0
    # Sampled by a version NEWER than the trainer's (the capture was told a version the trainer
    # has not reached: a resumed run on an engine that kept later weights, a wrong stamp). Age 0
    # in the mean, but counted: a number silently clamped hides a broken version chain.
    ahead_tokens: int = 0

    def metrics(self) -> dict[str, float]:
        n = max(self.trainable_tokens, 1)
        return {
            "staleness/mean": self.staleness_sum / n,
            "staleness/max": float(self.staleness_max),
            "staleness/stale_token_frac": self.stale_tokens / n,
            "staleness/over_bound_tokens": float(self.over_bound_tokens),
            "staleness/dropped_tokens": float(self.dropped_tokens),
            "staleness/ahead_tokens": float(self.ahead_tokens),
        }


def apply_staleness(
    rows: list[Row], policy_version: int, max_staleness: int, rule: str
) -> tuple[list[list[int]], StalenessStats]:
    """Per row, the loss mask to train with after the staleness rule; plus counts.

    Returns new mask lists only where "drop" changed something (rows are never mutated).
    """
    stats = StalenessStats()
    masks: list[list[int]] = []
    bound = policy_version - max_staleness  # a token sampled before this is over the bound
    for row in rows:
        versions = list(compress(row.version_start, row.loss_mask))  # trainable tokens only
        if not versions:
            masks.append(row.loss_mask)
            continue
        raw = [policy_version - v for v in versions]
        ahead = sum(1 for a in raw if a < 0)
        stats.ahead_tokens += ahead
        ages = [max(a, 0) for a in raw] if ahead else raw
        stats.trainable_tokens += len(ages)
        stats.staleness_sum += sum(ages)
        stats.staleness_max = max(stats.staleness_max, max(ages))
        stats.stale_tokens += sum(1 for a in ages if a >= 1)
        over = sum(1 for v in versions if v < bound)
        stats.over_bound_tokens += over
        if over and rule == "drop":
            mask = [0 if (m and v < bound) else m
                    for m, v in zip(row.loss_mask, row.version_start, strict=True)]
            stats.dropped_tokens += over
            masks.append(mask)
        else:
            masks.append(row.loss_mask)
    return masks, stats
