"""`HarnessAsyncGRPOTrainer`: wires model, optimizer, rollout producer, step, sync, checkpoints.

    trainer = HarnessAsyncGRPOTrainer(
        model="path/or/hub-id" | PreTrainedModel,
        harness_session_factory=functools.partial(HarborSessionFactory, proxy_url, split=...),
        args=AsyncGRPOConfig(num_generations=8, max_concurrent_rollouts=8, ...),
        rollout_reward_fn=None,          # outcome -> float | None; default: verifier env_reward
        reward_funcs=None,               # more named reward functions, each logged
        weight_sync=None,                # WeightSync: push(model, version) after each update
        on_version=None,                 # e.g. capture_client.set_weight_version
    )
    trainer.train()

The factory is called once, with `sampling=` the trainer's own policy (AsyncGRPOConfig.sampling():
temperature + no-op truncation knobs + max_tokens), because the loss scores tokens under exactly
that distribution. The order of one step is in trainer/loop.py; this file only sets things up
and runs the outer loop. Under torchrun, rank 0 runs the rollouts and every rank steps.

What it refuses: a factory instance (it could not pin the sampling policy), a config with any
problem (all listed at once, before the model loads), and a malformed capture (CaptureError
stops training; see trainer/rows.py).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from trainer.checkpoint import TrainerState, find_latest, load_checkpoint, save_checkpoint
from trainer.config import AsyncGRPOConfig
from trainer.distributed import (
    DistInfo,
    FullModelView,
    broadcast_object,
    full_state_dict,
    init_distributed,
    shard_model,
)
from trainer.groups import PreparedGroup, group_metrics, prepare_group
from trainer.loop import StepInput, run_step, step_input_from_groups
from trainer.metrics import MetricsWriter
from trainer.producer import FinishedGroup, RolloutProducer
from trainer.rewards import RewardFunc, normalize_reward_funcs
from trainer.rollouts import as_rollout_source

__all__ = ["HarnessAsyncGRPOTrainer", "WeightSync"]

log = logging.getLogger(__name__)


@runtime_checkable
class WeightSync(Protocol):
    """Pushes the trainer's weights into the engine. Called on rank 0 after every update.

    `model` is the HF model on a single process; under FSDP a `FullModelView` with gathered full
    tensors (`named_parameters()`, `state_dict()`, `config`). `version` is the new policy
    version (1 after the first update).
    """

    def push(self, model: Any, version: int) -> None: ...


def _dtype(args: AsyncGRPOConfig, device: torch.device) -> tuple[torch.dtype, str]:
    if args.dtype == "float32":
        return torch.float32, "dtype=float32 (config)"
    if args.dtype == "bfloat16":
        return torch.bfloat16, "dtype=bfloat16 (config)"
    if device.type == "cuda":
        return torch.bfloat16, "dtype=auto -> bfloat16 on CUDA"
    return torch.float32, "dtype=auto -> float32 on CPU (the CPU engine serves float32)"


class HarnessAsyncGRPOTrainer:
    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        harness_session_factory: Callable[..., Any],
        args: AsyncGRPOConfig | None = None,
        train_dataset: Sequence[Any] | None = None,
        rollout_reward_fn: Callable[[Any], float | None] | None = None,
        reward_funcs: Sequence[Callable | RewardFunc] | None = None,
        weight_sync: WeightSync | None = None,
        on_version: Callable[[int], None] | None = None,
        tokenizer: Any = None,
    ):
        self.args = args = args or AsyncGRPOConfig()
        args.check()  # every config problem at once, before anything loads
        self.reward_funcs = normalize_reward_funcs(rollout_reward_fn, reward_funcs)
        if weight_sync is not None and not callable(getattr(weight_sync, "push", None)):
            raise TypeError("weight_sync must have push(model, version: int)")
        self.weight_sync = weight_sync
        self.on_version = on_version
        self.train_dataset = train_dataset
        self.dist: DistInfo = init_distributed()
        random.seed(args.seed)
        torch.manual_seed(args.seed)

        dtype, why = _dtype(args, self.dist.device)
        log.info("trainer %s; %s", self.dist.reason, why)
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM, AutoTokenizer

            self.model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
            if tokenizer is None:
                tokenizer = AutoTokenizer.from_pretrained(str(model))
        else:
            self.model = model.to(dtype)
        self.tokenizer = tokenizer
        self.model.to(self.dist.device)
        self.ref_model = None
        if args.beta > 0:  # the initial policy, frozen
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        if self.dist.distributed:
            shard_model(self.model)
            if self.ref_model is not None:
                shard_model(self.ref_model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=args.learning_rate,
                                           betas=tuple(args.adam_betas),
                                           weight_decay=args.weight_decay)
        warm = args.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warm) if warm else 1.0)
        self.state = TrainerState()
        self._maybe_resume()
        # Only rank 0 talks to sessions; the factory is called here so a bad one fails early.
        self.source = None
        if self.dist.is_main:
            self.source = as_rollout_source(harness_session_factory, args.sampling(),
                                            max_concurrent=args.max_concurrent_rollouts)
        self.history: list[dict[str, float]] = []  # every step's metrics (rank 0)

    # -- resume ----------------------------------------------------------------------------------
    def _maybe_resume(self) -> None:
        want = self.args.resume_from_checkpoint
        if not want:
            return
        path = find_latest(self.args.output_dir) if want is True else Path(want)
        if path is None:
            log.info("resume_from_checkpoint=True but %s has no checkpoint: starting fresh",
                     self.args.output_dir)
            return
        self.state = load_checkpoint(path, model=self.model, optimizer=self.optimizer,
                                     scheduler=self.scheduler, dist_info=self.dist)
        log.info("resumed from %s: step %d, version %d, next group %d", path, self.state.step,
                 self.state.policy_version, self.state.next_group_index)

    def save(self) -> Path:
        return save_checkpoint(self.args.output_dir, model=self.model, optimizer=self.optimizer,
                               scheduler=self.scheduler, state=self.state, dist_info=self.dist,
                               tokenizer=self.tokenizer, total_limit=self.args.save_total_limit)

    # -- the outer loop --------------------------------------------------------------------------
    def train(self) -> list[dict[str, float]]:
        """Run until `max_steps`; returns every step's metrics on rank 0 ([] elsewhere)."""
        self._sync_resumed_weights()
        if not self.dist.is_main:
            while self._follower_step():
                pass
            return []
        return asyncio.run(self._train_main())

    def _sync_resumed_weights(self) -> None:
        """After a resume the engine may still serve older weights (or the initial ones after a
        restart): push the checkpoint's before any rollout samples from the engine."""
        has_sync = broadcast_object(self.weight_sync is not None, self.dist)
        if not has_sync or self.state.policy_version == 0:
            return
        if self.dist.distributed:
            full = full_state_dict(self.model, self.dist)
            if self.dist.is_main:
                self.weight_sync.push(FullModelView(full, self.model), self.state.policy_version)
        else:
            self.weight_sync.push(self.model, self.state.policy_version)
        if self.dist.is_main and self.on_version is not None:
            self.on_version(self.state.policy_version)
        log.info("pushed resumed weights (version %d) to the engine", self.state.policy_version)

    def _follower_step(self) -> bool:
        metrics = run_step(self, None)  # receives rank 0's StepInput via broadcast
        if metrics is None:
            return False
        if metrics["checkpoint"]:
            self.save()
        return True

    def _should_save(self, step_after: int) -> bool:
        a = self.args
        return step_after >= a.max_steps or (a.save_steps > 0 and step_after % a.save_steps == 0)

    async def _train_main(self) -> list[dict[str, float]]:
        a = self.args
        writer = MetricsWriter.create(a, enabled=True, start_step=self.state.step)
        producer = RolloutProducer(
            self.source, num_generations=a.num_generations, groups_per_step=a.groups_per_step,
            max_staleness=a.max_staleness, max_concurrent_rollouts=a.max_concurrent_rollouts,
            start_group=self.state.next_group_index, version=lambda: self.state.policy_version,
            train_dataset=self.train_dataset, prepare=self._prepare_group,
        )
        names = [f.name for f in self.reward_funcs]
        producer.start()
        try:
            while self.state.step < a.max_steps:
                finished = [await producer.next_group() for _ in range(a.groups_per_step)]
                save = self._should_save(self.state.step + 1)
                metrics = await asyncio.to_thread(self._prepare_and_step, finished, names, save)
                metrics["rollouts/in_flight"] = float(producer.in_flight)
                self.history.append(metrics)
                writer.log(self.state.step, metrics)
                await producer.step_done(self.state.step)
        finally:
            await producer.stop()
            if self.dist.distributed:
                await asyncio.to_thread(run_step, self, None)  # tells followers to stop
            writer.close()
        return self.history

    def _prepare_group(self, f: FinishedGroup) -> PreparedGroup:
        """Runs in a producer thread when group f is whole (see RolloutProducer)."""
        return prepare_group(f.results, group_index=f.index, reward_funcs=self.reward_funcs,
                             scale_rewards=self.args.scale_rewards,
                             dispatch_version=f.dispatch_version)

    def _prepare_and_step(self, finished: list, names: list[str], save: bool) -> dict[str, float]:
        t0 = time.perf_counter()
        groups: list[PreparedGroup] = [
            f.prepared if f.prepared is not None else self._prepare_group(f) for f in finished
        ]
        inp: StepInput = step_input_from_groups(groups, sync=self.weight_sync is not None,
                                                save=save)
        t_groups = time.perf_counter() - t0
        metrics = run_step(self, inp)
        self.state.next_group_index = finished[-1].index + 1
        if save:
            self.save()
        metrics.update(group_metrics(groups, names))
        metrics["time/groups_to_rows_s"] = t_groups
        metrics["data/first_group"] = float(finished[0].index)
        metrics["data/next_group_index"] = float(self.state.next_group_index)
        total = metrics["time/step_s"] + t_groups
        busy = metrics["time/forward_backward_s"] + metrics["time/optimizer_s"] \
            + metrics["time/weight_sync_s"]
        metrics["time/overhead_frac"] = max(total - busy, 0.0) / max(total, 1e-9)
        return metrics
