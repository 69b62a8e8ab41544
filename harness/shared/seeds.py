"""Sampling seeds: the same command with the same --seed samples the same tokens (issue 32).

A run's seed reaches the sessions as `sampling["seed"]` (the trainer's policy, harness.eval's and
the before/after evaluation's). Each rollout's capture session gets its own seed derived here from
the run's seed and what names the rollout, never a clock or a uuid:

    rollout_seed(run_seed, task_id, seed, episode_id)

`seed` is the rollout's task selector (the GRPO group index in training, task index plus repeat in
an evaluation) and `episode_id` its name within the group: the trainer names its rollouts
`g{g}-r{k}` and the evaluations `t{t}-r{r}`, so the same rollout has the same seed however the
rollouts are scheduled. The proxy then derives each call's engine seed from the rollout's seed and
the call's number (capture.sampling). The before and after evaluations use the same rollout seeds
on purpose: their difference then compares the two weights under the same random draws.

A rollout without an episode_id is given a uuid by the factory: its seed is then not reproducible
(a caller that wants reproducible rollouts names them).
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["check_run_seed", "eval_rollouts", "rollout_seed"]

MAX_SEED = (1 << 63) - 1  # vLLM takes int64 seeds; capture.sampling refuses others


def check_run_seed(sampling: dict[str, Any]) -> None:
    """Raise ValueError naming the fix if `sampling["seed"]` is present and not a usable seed."""
    seed = sampling.get("seed")
    if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):
        raise ValueError(f"sampling seed (the run's --seed) must be an integer in [0, 2**63), "
                         f"got {seed!r}")


def rollout_seed(run_seed: int, task_id: str, seed: int | None, episode_id: str | None) -> int:
    """The capture session's sampling seed for one rollout: a hash of what names it."""
    key = f"rollout:{run_seed}:{len(task_id)}:{task_id}:{seed}:{episode_id}"
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest()) >> 1


def eval_rollouts(n_tasks: int, per_task: int) -> list[tuple[int, str]]:
    """(seed, episode_id) of every evaluation rollout (harness.eval, harness.run.learning): seed
    r * n_tasks + t picks task t (seed k: task k % n_tasks) for repeat r, and the name `t{t}-r{r}`
    with it fixes the rollout's sampling seed whatever order the rollouts run in."""
    return [(r * n_tasks + t, f"t{t}-r{r}") for r in range(per_task) for t in range(n_tasks)]
