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

LoRA (`lora_rank > 0`, trainer/lora.py): the base is frozen in the compute dtype and the fp32
adapters are all that AdamW, checkpoints, pushes (trainer/weight_sync/lora.py) and the export hold.

Numerics: parameters and AdamW state are fp32 whatever `dtype` says; `dtype` is the compute
dtype (bf16 on CUDA by default). One process computes under autocast; FSDP2 gets a
MixedPrecisionPolicy (param bf16, reduce fp32). Either way each update lands on fp32 master
weights, and the engine receives them cast to the compute dtype, one parameter at a time.
Measured on CPU (tests/test_trainer_numerics.py): with fp32 master weights an lr 1e-6 step moves
as many elements as the fp32 reference; pure-bf16 parameters move about 2% of them.

Memory (issue 30; trainer/memory.py has the calculator): under torchrun a model directory is
built on the meta device, sharded and read shard by shard (trainer/model_init.py), the reference
model too; decoder layers are checkpointed (`gradient_checkpointing`, on by default on CUDA); and
log-probs never build a [tokens x vocabulary] fp32 tensor (`logits_chunk_tokens`).

What it refuses: a factory instance (it could not pin the sampling policy), a config with any
problem (all listed at once, before the model loads), an empty train_dataset, and a malformed
capture (CaptureError stops training; see trainer/rows.py).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from trainer.checkpoint import (
    TrainerState,
    export_adapter,
    export_model,
    find_latest,
    load_checkpoint,
    save_checkpoint,
)
from trainer.config import AsyncGRPOConfig
from trainer.distributed import (
    DistInfo,
    broadcast_object,
    fail_fast,
    init_distributed,
    wait_for_all_ranks,
)
from trainer.errors import ConfigError
from trainer.groups import PreparedGroup, append_group_records, group_metrics, prepare_group
from trainer.loop import StepInput, push_weights, run_step, step_input_from_groups
from trainer.metrics import MetricsWriter
from trainer.model_init import build_model, build_reference, enable_gradient_checkpointing
from trainer.producer import FinishedGroup, RolloutProducer
from trainer.reward_shuffle import RewardShuffle
from trainer.rewards import RewardFunc, normalize_reward_funcs
from trainer.rollouts import as_rollout_source

__all__ = ["HarnessAsyncGRPOTrainer", "WeightSync"]

log = logging.getLogger(__name__)


@runtime_checkable
class WeightSync(Protocol):
    """Pushes the trainer's weights into the engine. Called on rank 0 after every update.

    `model` is a `FullModelView` (trainer/weight_sync/source.py): `named_parameters()` streams
    full tensors one at a time, in the compute dtype (bf16 on CUDA while the trainer keeps fp32
    master weights), readable once; `describe_parameters()` and `config` too. Under FSDP each
    element is a gather the other ranks run with it. `version` is the new policy version (1 after
    the first update). Never called after a step whose loss or gradient was not finite.
    """

    def push(self, model: Any, version: int) -> None: ...


def _dtype(args: AsyncGRPOConfig, device: torch.device) -> tuple[torch.dtype, str]:
    """The COMPUTE dtype. Parameters and optimizer state are always fp32 (master weights)."""
    if args.dtype == "float32":
        return torch.float32, "dtype=float32 (config)"
    if args.dtype == "bfloat16":
        return torch.bfloat16, "dtype=bfloat16 (config)"
    if device.type == "cuda":
        return torch.bfloat16, "dtype=auto -> bfloat16 on CUDA"
    return torch.float32, "dtype=auto -> float32 on CPU (the CPU engine serves float32)"


def _numerics(compute: torch.dtype, distributed: bool) -> tuple[torch.dtype | None, str]:
    """How a bf16 compute dtype is applied while the weights stay fp32 (see the module doc)."""
    if compute == torch.float32:
        return None, "fp32 parameters, fp32 compute"
    if distributed:
        return None, (f"fp32 master parameters and AdamW state; FSDP2 MixedPrecisionPolicy "
                      f"(param {compute}, reduce float32)")
    return compute, f"fp32 master parameters and AdamW state; forward under {compute} autocast"


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
        self.reward_shuffle = (RewardShuffle(args.seed, args.shuffle_mode)
                               if args.shuffle_rewards else None)
        if weight_sync is not None and not callable(getattr(weight_sync, "push", None)):
            raise TypeError("weight_sync must have push(model, version: int)")
        self.weight_sync = weight_sync
        self.on_version = on_version
        _check_dataset(train_dataset)
        self.train_dataset = train_dataset
        self.dist: DistInfo = init_distributed(args.dist_timeout_s, args.step_wait_timeout_s)
        # Before any step collective: rank 0 may come minutes late (engine, "before" eval).
        wait_for_all_ranks(self.dist, "trainer start-up")
        random.seed(args.seed)
        torch.manual_seed(args.seed)

        # Master weights: parameters (and so AdamW's state) are fp32 whatever the compute dtype.
        # A pure-bf16 AdamW step of lr 1e-6 on N(0, 0.02) weights rounds back for ~98% of them
        # (issue 16); fp32 master weights take every update and the engine gets a bf16 cast.
        self.compute_dtype, why = _dtype(args, self.dist.device)
        self.autocast_dtype, how = _numerics(self.compute_dtype, self.dist.distributed)
        log.info("trainer %s; %s; %s", self.dist.reason, why, how)
        # Memory (issue 30): under torchrun the model is built on the meta device, sharded, and
        # each rank reads only its shards; the reference model likewise (trainer/model_init.py).
        if isinstance(model, (str, Path)) and tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(model))
        self.tokenizer = tokenizer
        self.ref_model = None
        if args.beta > 0:  # the initial policy, frozen: it never steps, so no master copy
            self.ref_model = build_reference(model, self.dist, self.compute_dtype)
        if args.lora_rank > 0:
            # LoRA (trainer/lora.py): the base frozen in the compute dtype, fp32 adapters only
            from trainer.lora import build_lora_model, trainable_summary

            self.model = build_lora_model(model, self.dist, self.compute_dtype, args)
            counts = trainable_summary(self.model)
            log.info("LoRA rank %d alpha %g on %s: %d trainable parameters (fp32), %d frozen (%s)",
                     args.lora_rank, args.lora_scale_alpha, ",".join(args.lora_target_modules),
                     counts["trainable_params"], counts["frozen_params"], self.compute_dtype)
        else:
            self.model = build_model(model, self.dist, self.compute_dtype)
        self.checkpointing, why_ckpt = enable_gradient_checkpointing(
            self.model, args.gradient_checkpointing, self.dist.device)
        log.info("%s; log-probs in chunks of %s tokens", why_ckpt,
                 args.logits_chunk_tokens or "all (dense)")
        # Only what trains: with LoRA, AdamW holds state for the adapters alone.
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        if args.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(trainable, lr=args.learning_rate,
                                             weight_decay=args.weight_decay)
        else:
            self.optimizer = torch.optim.AdamW(trainable, lr=args.learning_rate,
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
                                     scheduler=self.scheduler, dist_info=self.dist,
                                     trainable_only=self.args.lora_rank > 0)
        log.info("resumed from %s: step %d, version %d, next group %d", path, self.state.step,
                 self.state.policy_version, self.state.next_group_index)

    def save(self) -> Path:
        return save_checkpoint(self.args.output_dir, model=self.model, optimizer=self.optimizer,
                               scheduler=self.scheduler, state=self.state, dist_info=self.dist,
                               total_limit=self.args.save_total_limit,
                               trainable_only=self.args.lora_rank > 0)

    def export(self) -> Path | None:
        """The trained model in HF layout at <output_dir>/model (every rank; rank 0 writes); with
        LoRA the adapter folder there (`python -m trainer.lora` merges it into an HF model)."""
        if self.args.lora_rank > 0:
            return export_adapter(self.args.output_dir, model=self.model, dist_info=self.dist,
                                  tokenizer=self.tokenizer)
        return export_model(self.args.output_dir, model=self.model, dist_info=self.dist,
                            tokenizer=self.tokenizer)

    # -- the outer loop --------------------------------------------------------------------------
    def train(self) -> list[dict[str, float]]:
        """Run until `max_steps`; returns every step's metrics on rank 0 ([] elsewhere).

        An error on any rank propagates out of here with no further collective (see
        trainer/distributed.py): the caller's process leaves and the launcher ends the others."""
        try:
            self._sync_resumed_weights()
            if not self.dist.is_main:
                while self._follower_step():
                    pass
                history = []
            else:
                history = asyncio.run(self._train_main())
            if self.args.export_model:
                self.export()
            return history
        except BaseException as exc:
            fail_fast(self.dist, exc)
            raise

    def _sync_resumed_weights(self) -> None:
        """After a resume the engine may still serve older weights (or the initial ones after a
        restart): push the checkpoint's before any rollout samples from the engine."""
        has_sync = broadcast_object(self.weight_sync is not None, self.dist)
        if not has_sync or self.state.policy_version == 0:
            return
        push_weights(self, self.state.policy_version)
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
            task_order_seed=a.seed if a.shuffle_dataset else None,
            end_group=a.max_steps * a.groups_per_step,
        )
        names = [f.name for f in self.reward_funcs]
        producer.start()
        finished_cleanly = False
        try:
            while self.state.step < a.max_steps:
                finished = [await producer.next_group() for _ in range(a.groups_per_step)]
                save = self._should_save(self.state.step + 1)
                metrics = await asyncio.to_thread(self._prepare_and_step, finished, names, save)
                metrics["rollouts/in_flight"] = float(producer.in_flight)
                self.history.append(metrics)
                writer.log(self.state.step, metrics)
                await producer.step_done(self.state.step)
            finished_cleanly = True
        finally:
            await producer.stop()
            # Only a clean end tells the followers to stop: after an error they may be inside
            # another collective, and a broadcast now would block or pair with the wrong one.
            if finished_cleanly and self.dist.distributed:
                await asyncio.to_thread(run_step, self, None)
            writer.close()
        return self.history

    def _prepare_group(self, f: FinishedGroup) -> PreparedGroup:
        """Runs in a producer thread when group f is whole (see RolloutProducer)."""
        return prepare_group(f.results, group_index=f.index, reward_funcs=self.reward_funcs,
                             scale_rewards=self.args.scale_rewards,
                             dispatch_version=f.dispatch_version,
                             shuffle=self.reward_shuffle,
                             flip=self.args.flip_rewards,
                             truncated=self.args.truncated_turns,
                             train_unplaced=self.args.train_unplaced_calls,
                             train_summary_calls=self.args.train_summary_calls)

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
        append_group_records(Path(self.args.output_dir) / "groups.jsonl", self.state.step, groups)
        metrics["time/groups_to_rows_s"] = t_groups
        metrics["data/first_group"] = float(finished[0].index)
        metrics["data/next_group_index"] = float(self.state.next_group_index)
        total = metrics["time/step_s"] + t_groups
        busy = metrics["time/forward_backward_s"] + metrics["time/optimizer_s"] \
            + metrics["time/weight_sync_s"]
        metrics["time/overhead_frac"] = max(total - busy, 0.0) / max(total, 1e-9)
        return metrics


def _check_dataset(train_dataset: Any) -> None:
    """An empty or unindexable dataset fails here, not as a producer that waits forever."""
    if train_dataset is None:
        return
    try:
        n = len(train_dataset)
    except TypeError as exc:
        raise ConfigError([f"train_dataset ({type(train_dataset).__name__}) has no len(): give a "
                           "sequence of tasks (list, datasets.Dataset) or None to let the session "
                           "factory pick tasks by seed"]) from exc
    if n == 0:
        raise ConfigError(["train_dataset is empty: give at least one task, or None to let the "
                           "session factory pick tasks by seed"])
