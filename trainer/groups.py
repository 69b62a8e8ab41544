"""A finished group -> rows with advantages, and the counts that say what happened to each rollout.

Order of decisions for one group (all rollouts of one task, one seed):

1. cause: infra_failure / verifier_failure (or a trainable cause with no trace) -> unscorable,
   counted by cause, out of the baseline;
2. reward: `score_rollout` (reward functions, else env_reward); a failing reward function ->
   cause "reward_failure", unscorable; a None reward -> unscorable;
3. (control runs only) `shuffle_rewards`: the scored rewards are permuted among the group's
   rollouts (trainer/reward_shuffle.py: seeded per group, balanced by default so the run's
   permutations carry no net signal); each rollout's record keeps its own reward as
   `reward_unshuffled`, and `reward/mean` is unchanged (a permutation keeps the multiset).
   `flip_rewards`: each scored reward r becomes 1 - r (kept as `reward_unflipped`); tampered
   rollouts keep their 0;
4. advantages over the scorable rollouts; a group that cannot give a gradient (no/one reward,
   zero variance) is skipped here, before any row is built or forwarded;
5. rows for each rollout with an advantage, built from its trace (trainer/rows.py); a malformed
   trace raises CaptureError and stops the run.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.advantages import group_advantages
from trainer.reward_shuffle import RewardShuffle
from trainer.rewards import ENV_REWARD, RewardFunc, score_rollout
from trainer.rollouts import TRAINABLE_CAUSES
from trainer.rows import Row, trace_to_rows

__all__ = ["PreparedGroup", "append_group_records", "group_metrics", "prepare_group"]


@dataclass
class PreparedGroup:
    """What one group gives a step: rows, the advantage of each row, and counts."""

    group_index: int
    rows: list[Row] = field(default_factory=list)
    row_advantages: list[float] = field(default_factory=list)
    causes: Counter[str] = field(default_factory=Counter)  # per rollout
    skipped: str | None = None
    rewards: list[float | None] = field(default_factory=list)  # per rollout (None: unscorable)
    reward_parts: dict[str, list[float]] = field(default_factory=dict)
    env_rewards: list[float] = field(default_factory=list)
    tool_calls: list[int] = field(default_factory=list)
    tool_failures: list[int] = field(default_factory=list)
    findings: Counter[str] = field(default_factory=Counter)
    reward_failures: list[str] = field(default_factory=list)
    sampled_tokens: int = 0
    timed_out: int = 0
    shuffled: bool = False  # rewards permuted among the rollouts (the shuffled-reward control)
    shuffle_signal: float = 0.0  # what the permutation still says (trainer/reward_shuffle.py)
    # One dict per rollout (episode_id, reward, parts, advantage): what the run viewer shows
    # as "the advantage it got"; grpo.py appends them to <output_dir>/groups.jsonl.
    per_rollout: list[dict[str, Any]] = field(default_factory=list)


def prepare_group(
    results: list[Any],
    *,
    group_index: int,
    reward_funcs: list[RewardFunc],
    scale_rewards: bool,
    dispatch_version: int,
    shuffle: RewardShuffle | None = None,
    flip: bool = False,
    truncated: str = "train",
    train_unplaced: bool = False,
    train_summary_calls: bool = False,
) -> PreparedGroup:
    """Score, baseline and row-ify one group's rollout results (harness RolloutResult-like)."""
    g = PreparedGroup(group_index=group_index)
    tampered: set[int] = set()  # positions whose 0 no shuffle may move
    for r in results:
        record: dict[str, Any] = {"episode_id": getattr(r, "episode_id", None), "reward": None,
                                  "parts": {}, "advantage": None}
        g.per_rollout.append(record)
        cause = getattr(r, "cause", "infra_failure")
        trace = getattr(r, "trace", None)
        outcome = getattr(r, "outcome", None)
        env = getattr(r, "env_reward", None)
        if env is None and outcome is not None:
            env = getattr(outcome, "env_reward", None)
        if outcome is not None:
            g.tool_calls.append(int(getattr(outcome, "tool_call_count", 0) or 0))
            g.tool_failures.append(int(getattr(outcome, "tool_failure_count", 0) or 0))
            g.timed_out += bool(getattr(outcome, "timed_out", False))
        if cause in TRAINABLE_CAUSES and trace is None:
            cause = "no_trace"
        if cause not in TRAINABLE_CAUSES:
            g.causes[cause] += 1
            g.rewards.append(None)
            continue
        if isinstance(env, (int, float)) and math.isfinite(env):  # NaN: unscorable, below
            g.env_rewards.append(float(env))
        if cause == "tampered":  # no reward function may pay a rollout that gamed its grade
            tampered.add(len(g.rewards))
            g.causes[cause] += 1
            record.update(reward=0.0)
            g.rewards.append(0.0)
            continue
        scored = score_rollout(outcome, env, reward_funcs)
        for name, value in scored.parts.items():
            if value is not None:
                g.reward_parts.setdefault(name, []).append(value)
        if scored.failure is not None:
            record.update(parts=dict(scored.parts), reward_failure=scored.failure)
            g.causes["reward_failure"] += 1
            g.reward_failures.append(scored.failure)
            g.rewards.append(None)
            continue
        g.causes[cause] += 1
        if scored.total is None:
            g.causes["unscorable"] += 1
        g.rewards.append(scored.total)
        record.update(reward=scored.total, parts=dict(scored.parts))
    if flip:
        _flip_rewards(g, tampered)
    if shuffle is not None:
        _shuffle_rewards(g, shuffle, tampered)
    adv = group_advantages(g.rewards, scale_rewards=scale_rewards)
    g.skipped = adv.skipped
    for record, a in zip(g.per_rollout, adv.advantages, strict=True):
        record["advantage"] = a
    if adv.skipped is not None:
        return g
    for r, a in zip(results, adv.advantages, strict=True):
        if a is None:
            continue
        rid = str(getattr(r, "episode_id", None) or id(r))
        rows, report = trace_to_rows(r.trace, rollout_id=rid, group_index=group_index,
                                     dispatch_version=dispatch_version, truncated=truncated,
                                     train_unplaced=train_unplaced,
                                     train_summary_calls=train_summary_calls)
        g.findings.update(report.counts())
        g.sampled_tokens += report.sampled_tokens
        g.rows.extend(rows)
        g.row_advantages.extend([a] * len(rows))
    return g


def _flip_rewards(g: PreparedGroup, fixed: set[int]) -> None:
    """r -> 1 - r for the scored rollouts (not unscorable, not tampered ones: a tampered
    rollout keeps its 0, or flipping would pay it)."""
    for i, r in enumerate(g.rewards):
        if r is not None and i not in fixed:
            g.per_rollout[i]["reward_unflipped"] = r
            g.per_rollout[i]["reward"] = g.rewards[i] = 1.0 - r


def _shuffle_rewards(g: PreparedGroup, shuffle: RewardShuffle, fixed: set[int]) -> None:
    """Permute the scored rewards among the scored rollouts (not unscorable, not tampered ones)."""
    positions = [i for i, r in enumerate(g.rewards) if r is not None and i not in fixed]
    earned = [float(g.rewards[i]) for i in positions]  # type: ignore[arg-type]
    values, g.shuffle_signal = shuffle.permute(g.group_index, earned) if earned else ([], 0.0)
    for i, value in zip(positions, values, strict=True):
        g.per_rollout[i]["reward_unshuffled"] = g.rewards[i]
        g.per_rollout[i]["reward"] = value
        g.rewards[i] = value
    g.shuffled = True


def append_group_records(path: Path, step: int, groups: list[PreparedGroup]) -> None:
    """One JSON line per group trained (or skipped) at `step`: its skip reason and, per rollout,
    the reward, its parts and the advantage. The run viewer (harness/view) reads this file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for g in groups:
            record = {"step": step, "group_index": g.group_index, "skipped": g.skipped,
                      "rollouts": g.per_rollout}
            if g.shuffled:
                record["shuffle_signal"] = g.shuffle_signal
            f.write(json.dumps(record, default=str) + "\n")


def group_metrics(groups: list[PreparedGroup], reward_names: list[str]) -> dict[str, float]:
    """The seed's metric names plus counts by cause; means over rollouts of these groups."""
    m: dict[str, float] = {}
    causes: Counter[str] = Counter()
    findings: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    rewards, env, calls, fails = [], [], [], []
    parts: dict[str, list[float]] = {}
    for g in groups:
        causes.update(g.causes)
        findings.update(g.findings)
        if g.skipped:
            skipped[g.skipped] += 1
        rewards += [r for r in g.rewards if r is not None]
        env += g.env_rewards
        calls += g.tool_calls
        fails += g.tool_failures
        for k, v in g.reward_parts.items():
            parts.setdefault(k, []).extend(v)
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    m["reward/mean"] = mean(rewards)
    m["reward/scored"] = float(len(rewards))
    for name in reward_names or [ENV_REWARD]:
        m[f"rewards/{name}/mean"] = mean(parts.get(name, []))
    if reward_names:
        m["rollout/correctness_mean"] = mean(env)
    m["tools/call_frequency"] = mean(calls)
    m["tools/failure_frequency"] = sum(fails) / sum(calls) if sum(calls) else 0.0
    failures = Counter(f.split(":", 1)[0] for g in groups for f in g.reward_failures)
    for name, n in failures.items():
        m[f"rewards/{name}/failures"] = float(n)
    # outcome.timed_out (TRL's contract) is also set at the step limit, which is how every
    # rollout of a 2-step task ends: counted as cut short, apart from rollouts/cause/timeout.
    m["rollouts/cut_short"] = float(sum(g.timed_out for g in groups))
    for cause, n in causes.items():
        m[f"rollouts/cause/{cause}"] = float(n)
    for reason, n in skipped.items():
        m[f"groups/skipped/{reason}"] = float(n)
    m["groups/used"] = float(sum(1 for g in groups if not g.skipped))
    m["reward/shuffled"] = float(any(g.shuffled for g in groups))
    if any(g.shuffled for g in groups):
        m["reward/shuffle_signal"] = sum(g.shuffle_signal for g in groups)
    for code, n in findings.items():
        m[f"rows/findings/{code}"] = float(n)
    return m
