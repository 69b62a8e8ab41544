"""The rollout producer: groups dispatched ahead of the trainer, released whole and in order.

    group g = num_generations rollouts of one task, all with seed=g
    its task: train_dataset[order(g // n)[g % n]], n = len(train_dataset); `order(e)` is epoch
    e's seeded permutation (`task_order_seed`), or the dataset's own order when it is None

Why a seeded shuffle per epoch: in the dataset's order a step's groups are neighbours, and a
generated family lists its variants side by side (three phrasings of one answer), so every step
would train one answer and every seed the same schedule. Each epoch still visits every task once.

Three rules, each against a known failure:

1. A group is released only when ALL its rollouts have finished (ok or not). Releasing the first
   k to finish would bias the baseline toward fast rollouts, which on agent tasks are the ones
   that gave up or crashed early; the mean would then be computed over the "quick" half only.
   A group waits for its slowest rollout; the trainer overlaps that wait with other groups.
2. Groups are released in index order, so step s always trains groups
   [s * groups_per_step, (s + 1) * groups_per_step): the data position is a single integer, and a
   resumed run sees the same tasks in the same steps as an uninterrupted one (the order is a
   function of the seed, the epoch and n alone).
3. Admission bounds staleness: group g is dispatched only once
   g // groups_per_step <= steps_done + max_staleness, i.e. at most `max_staleness` steps
   ahead of the trainer (max_staleness=0 is synchronous, on-policy GRPO); and never at or past
   `end_group` (the trainer's max_steps * groups_per_step), so no rollout runs for a step
   that will not come.

`max_concurrent_rollouts` bounds rollouts in flight (the session factory may bound them too).
A task that cannot be read from `train_dataset`, or any other error outside a rollout, stops
the run at once (re-raised from `next_group`) rather than leaving the trainer waiting.
An exception escaping `source.rollout` that is a CaptureError stops the run (re-raised from
`next_group`); any other is a bug in the source, recorded as an infra_failure with its error
and logged with its traceback, never swallowed silently.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainer.errors import CaptureError, TrainerError
from trainer.rollouts import Rollout

__all__ = ["FinishedGroup", "RolloutProducer"]

log = logging.getLogger(__name__)


@dataclass
class FinishedGroup:
    index: int
    results: list[Any]  # RolloutResult-like, one per generation, in generation order
    dispatch_version: int  # trainer policy version when the group was dispatched
    dispatched_at: float
    finished_at: float = field(default_factory=time.monotonic)
    prepared: Any = None  # what `prepare(group)` returned (rows etc.), built off the step's path


class RolloutProducer:
    def __init__(
        self,
        source: Any,
        *,
        num_generations: int,
        groups_per_step: int,
        max_staleness: int,
        max_concurrent_rollouts: int,
        start_group: int,
        version: Callable[[], int],
        train_dataset: Sequence[Any] | None = None,
        prepare: Callable[[FinishedGroup], Any] | None = None,
        task_order_seed: int | None = None,
        end_group: int | None = None,
    ):
        self.source = source
        self.num_generations = num_generations
        self.groups_per_step = groups_per_step
        self.max_staleness = max_staleness
        self.version = version
        self.train_dataset = train_dataset
        self.prepare = prepare
        self.task_order_seed = task_order_seed
        # The first group no step will train (max_steps * groups_per_step): never dispatched, so
        # the last steps' admission bound does not pay for rollouts nobody trains (issue 32).
        self.end_group = end_group
        self._orders: dict[tuple[int, int], list[int]] = {}  # (epoch, n) -> permutation
        self.next_dispatch = start_group
        self.next_release = start_group
        self._steps_done = start_group // groups_per_step
        self._slots = asyncio.Semaphore(max_concurrent_rollouts)
        self._done: dict[int, FinishedGroup] = {}
        self._changed = asyncio.Condition()
        self._tasks: set[asyncio.Task] = set()
        self._error: BaseException | None = None
        self._runner: asyncio.Task | None = None
        self.in_flight = 0

    # -- control ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._runner = asyncio.create_task(self._dispatch_forever(), name="rollout-producer")

    async def step_done(self, steps_done: int) -> None:
        """The trainer finished a step: admit the groups that are now within the bound."""
        async with self._changed:
            self._steps_done = steps_done
            self._changed.notify_all()

    async def stop(self) -> None:
        for t in [self._runner, *self._tasks]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in [self._runner, *self._tasks] if t is not None),
                             return_exceptions=True)

    async def next_group(self) -> FinishedGroup:
        """The next group in index order, once all its rollouts have finished."""
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._error is not None or self.next_release in self._done)
            if self._error is not None:
                raise self._error
            group = self._done.pop(self.next_release)
            self.next_release += 1
            return group

    # -- internals -------------------------------------------------------------------------------
    def _admissible(self) -> bool:
        if self.end_group is not None and self.next_dispatch >= self.end_group:
            return False
        return self.next_dispatch // self.groups_per_step <= self._steps_done + self.max_staleness

    async def _fail(self, error: BaseException) -> None:
        """Stop the run: `next_group` raises `error` instead of waiting for a group forever."""
        async with self._changed:
            if self._error is None:
                self._error = error
            self._changed.notify_all()

    async def _dispatch_forever(self) -> None:
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(self._admissible)
                g = self.next_dispatch
                self.next_dispatch += 1
                task = asyncio.create_task(self._run_group(g), name=f"group-{g}")
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception as exc:  # a bug here must end the run, not leave it waiting
            await self._fail(exc)
            raise

    def task_index(self, g: int, n: int) -> int:
        """The train_dataset index of group g's task, for a dataset of n tasks."""
        if self.task_order_seed is None:
            return g % n
        epoch = g // n
        order = self._orders.get((epoch, n))
        if order is None:
            order = list(range(n))
            # A str seed is hashed with SHA-512: the same order in every process and Python run.
            random.Random(f"task-order:{self.task_order_seed}:{epoch}").shuffle(order)
            self._orders = {(epoch, n): order}  # groups arrive in order: one epoch is enough
        return order[g % n]

    def _task_of(self, g: int) -> Any:
        if self.train_dataset is None:
            return None
        n = len(self.train_dataset)
        if n == 0:
            raise TrainerError("train_dataset is empty (it had tasks when training started): "
                               f"no task for group {g}")
        i = self.task_index(g, n)
        try:
            return self.train_dataset[i]
        except Exception as exc:
            raise TrainerError(f"train_dataset[{i}] (the task of group {g}) raised "
                               f"{type(exc).__name__}: {exc}; fix the dataset") from exc

    async def _run_group(self, g: int) -> None:
        try:
            await self._run_group_checked(g)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failing dataset, or a bug: fail fast, never hang
            await self._fail(exc)

    async def _run_group_checked(self, g: int) -> None:
        version, t0 = self.version(), time.monotonic()
        task = self._task_of(g)
        results = await asyncio.gather(*(self._one(g, k, task) for k in range(self.num_generations)),
                                       return_exceptions=True)
        group = FinishedGroup(g, list(results), version, t0)
        error = next((r for r in results if isinstance(r, BaseException)
                      and not isinstance(r, asyncio.CancelledError)), None)
        if error is None and self.prepare is not None:
            # Scoring and trace -> rows run in a thread as soon as the group is whole, so the
            # step that consumes it only packs (and a CaptureError surfaces here, early).
            try:
                group.prepared = await asyncio.to_thread(self.prepare, group)
            except Exception as exc:
                error = exc
        async with self._changed:
            # A CaptureError (or anything _one did not turn into a Rollout) stops the run.
            if error is not None:
                self._error = error
            self._done[g] = group
            self._changed.notify_all()

    async def _one(self, g: int, k: int, task: Any) -> Any:
        # A name, not a uuid: the rollout's sampling seed is derived from it (harness.shared.seeds), so
        # a rerun with the same seed samples rollout k of group g alike.
        episode = f"g{g}-r{k}"
        async with self._slots:
            self.in_flight += 1
            try:
                return await self.source.rollout(task=task, seed=g, episode_id=episode)
            except CaptureError:
                raise
            except Exception as exc:  # a source bug: counted as infra, logged loudly
                log.error("rollout source raised for %s (counted as infra_failure)", episode,
                          exc_info=True)
                return Rollout(cause="infra_failure", seed=g, episode_id=episode,
                               error=f"source raised {exc!r}")
            finally:
                self.in_flight -= 1
