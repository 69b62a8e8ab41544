"""A RolloutSource that replays TrainingTraces: for tests, benchmarks and dry runs.

It is the trainer's narrow seam made concrete (httpx's MockTransport idea): the trainer cannot
tell it from HarborSessionFactory, so a dry run exercises the same producer, rows, loss and
checkpoint code as a real run, with no sandbox, agent or engine. Traces can be real captures
saved from the proxy (`TrainingTrace.model_dump()`, a dict), or built here from token lists.

The traces built here are plain dataclasses with the fields of OpenEnv's `TrainingTrace` /
`TrainingTurn` (schema_version 1), which is all trainer/rows.py reads: the trainer side imports
nothing from openenv, so that it can share an environment with vLLM (DESIGN.md section 1).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from trainer.rollouts import Rollout, RolloutOutcome

__all__ = ["ReplaySource", "TrainingTrace", "TrainingTurn", "make_trace", "make_turn",
           "synthetic_trace"]


@dataclass
class TrainingTurn:
    """One engine call, as OpenEnv's TrainingTurn spells it."""

    node_id: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    per_token_logps: list[float]
    loss_mask: list[int]
    request: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TrainingTrace:
    """A rollout's turns, as OpenEnv's TrainingTrace spells it (schema_version 1)."""

    turns: list[TrainingTurn] = field(default_factory=list)
    schema_version: int = 1

    def model_dump(self) -> dict[str, Any]:
        return asdict(self)


def make_turn(
    prompt: list[int],
    completion: list[int],
    logps: list[float] | None = None,
    completion_mask: list[int] | None = None,
    *,
    node_id: str,
    version: int | tuple[int, int] | None = 0,
    **metadata: Any,
) -> TrainingTurn:
    """One captured engine call; `completion_mask` defaults to all ones."""
    mask = [0] * len(prompt) + list(completion_mask if completion_mask is not None
                                    else [1] * len(completion))
    meta = dict(metadata)
    if version is not None:
        v0, v1 = version if isinstance(version, tuple) else (version, version)
        meta.update(weight_version_start=v0, weight_version_end=v1)
    return TrainingTurn(
        node_id=node_id, prompt_token_ids=list(prompt), completion_token_ids=list(completion),
        per_token_logps=list(logps if logps is not None else [-1.0] * len(completion)),
        loss_mask=mask, metadata=meta,
    )


def make_trace(*turns: TrainingTurn) -> TrainingTrace:
    return TrainingTrace(turns=list(turns))


def synthetic_trace(
    rng: random.Random, *, turns: int = 3, prompt_len: int = 24, completion_len: int = 12,
    tool_len: int = 8, vocab: int = 4000, version: int = 0, logp: float | None = None,
) -> TrainingTrace:
    """An agent-shaped trace: each turn's prompt extends the last (one row per rollout)."""
    out, held = [], [rng.randrange(10, vocab) for _ in range(prompt_len)]
    for t in range(turns):
        completion = [rng.randrange(10, vocab) for _ in range(completion_len)]
        logps = [logp if logp is not None else -rng.uniform(0.5, 9.0) for _ in completion]
        out.append(make_turn(held, completion, logps, node_id=f"n{t}", version=version))
        held = held + completion + [rng.randrange(10, vocab) for _ in range(tool_len)]
    return TrainingTrace(turns=out)


class ReplaySource:
    """`rollout(task, seed, episode_id)` -> Rollout from `trace_fn(seed, k)` / `reward_fn(seed, k)`.

    k counts the rollouts asked for each seed (0..G-1). `calls` records (seed, episode_id) in
    dispatch order; `delay_fn(seed, k)` can make some rollouts slow; `cause_fn(seed, k)` injects
    failures ("infra_failure", ...).
    """

    def __init__(
        self,
        trace_fn: Callable[[int, int], Any],
        reward_fn: Callable[[int, int], float | None],
        *,
        delay_fn: Callable[[int, int], float] | None = None,
        cause_fn: Callable[[int, int], str] | None = None,
    ):
        self.trace_fn, self.reward_fn = trace_fn, reward_fn
        self.delay_fn, self.cause_fn = delay_fn, cause_fn
        self.calls: list[tuple[int, str]] = []
        self._per_seed: dict[int, int] = {}

    async def rollout(self, task: Any = None, seed: int | None = None,
                      episode_id: str | None = None) -> Rollout:
        seed = 0 if seed is None else seed
        k = self._per_seed.get(seed, 0)
        self._per_seed[seed] = k + 1
        self.calls.append((seed, episode_id or ""))
        if self.delay_fn is not None:
            await asyncio.sleep(self.delay_fn(seed, k))
        else:
            await asyncio.sleep(0)
        cause = self.cause_fn(seed, k) if self.cause_fn is not None else "ok"
        if cause in ("infra_failure", "verifier_failure"):
            return Rollout(cause=cause, seed=seed, episode_id=episode_id, error="injected")
        reward = self.reward_fn(seed, k)
        outcome = RolloutOutcome(env_reward=reward, completion=[], trace=[], tool_call_count=2,
                                 tool_failure_count=1, tool_calls_by_name={"bash": 2},
                                 timed_out=cause == "timeout")
        return Rollout(cause=cause, seed=seed, episode_id=episode_id,
                       trace=self.trace_fn(seed, k), outcome=outcome, env_reward=reward,
                       task_id=None if task is None else str(task))
