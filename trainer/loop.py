"""The async GRPO step, written out in order. Read this file top to bottom to know what happens.

Our GRPO in five lines (the maths is in trainer/loss.py, numbered):
1. Advantages are group-relative over the scored rollouts of one task, (r - mean) / (std + eps),
   std optional; a `None` reward leaves the baseline and is never trained (inventing a 0 would
   pull the group's baseline down), infra/verifier/reward failures likewise, all counted.
2. The ratio is taken against the behaviour logprobs mu the engine returned when it sampled, and
   truncated at `is_cap` (TIS, per token): one correction for train/inference mismatch AND
   staleness. Then the PPO clip (1 - eps, 1 + eps_high).
3. Staleness is bounded in policy versions: the producer admits group g only while
   g // groups_per_step <= steps_done + max_staleness; at consumption every trainable token's
   version (capture metadata) is checked and tokens over the bound are corrected or dropped
   (`staleness_rule`), and counted.
4. A group is released only when all its rollouts have finished, so fast rollouts cannot bias
   the baseline; groups are consumed in index order, so the data position is one integer.
5. One optimizer update per step (all micro-batches accumulate), then weights go to the engine
   and the version to the capture proxy. A step whose loss or gradient norm is not finite makes
   no update (counted: `steps/nonfinite_skipped`, `steps/nonfinite_total`): the weights, the
   version and the engine stay as they were.

Timeline (max_staleness=1, groups_per_step=1, G = group, v = policy version):

    rollouts  |--G0 (v0)--|--G1 (v0)---|       |--G2 (v1)--|         |--G3 (v2)-- ...
              ^dispatch   ^released whole      ^G2 admitted when step 0 is done (2 <= 0+1+1)
    trainer               [step 0: G0 ]sync v1 [step 1: G1 ]sync v2  [step 2: G2 ]
                           ^staleness checked: per token, v_now - weight_version_start
    engine    v0 ......................| v1 ................| v2 ..................
              ^ each engine call stamps weight_version_start/end into the capture (the version
                the proxy was told at the last sync); a call across a sync straddles two versions

Commands:
    CPU, one process:   python -m harness.train ...   (or HarnessAsyncGRPOTrainer(...).train())
    CPU, two processes: torchrun --nproc-per-node 2 your_script.py   (gloo, FSDP2)
    GPU, 8 processes:   torchrun --nproc-per-node 8 your_script.py   (nccl, FSDP2)
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainer.distributed import FullModelView, broadcast_object
from trainer.forward import microbatch_logprobs
from trainer.groups import PreparedGroup
from trainer.loss import STAT_KEYS, policy_loss
from trainer.packing import MicroBatch, pack_rows
from trainer.prefix_tree import pack_tree
from trainer.rows import Row
from trainer.staleness import apply_staleness
from trainer.tree_attention import tree_backward

__all__ = ["StepInput", "push_weights", "run_step"]

log = logging.getLogger(__name__)


@dataclass
class StepInput:
    """What rank 0 broadcasts to every rank for one step (None ends the run)."""

    rows: list[Row] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)  # one per row
    sync: bool = False  # push weights after the update (every rank enters the gather)
    save: bool = False  # checkpoint after the step (every rank enters the gathers)


def step_input_from_groups(groups: list[PreparedGroup], *, sync: bool, save: bool) -> StepInput:
    inp = StepInput(sync=sync, save=save)
    for g in groups:
        inp.rows.extend(g.rows)
        inp.advantages.extend(g.row_advantages)
    return inp


def _pack_budget(model: torch.nn.Module, rows: list[Row], budget: int) -> int:
    """The micro-batch token budget: the configured one, capped on CPU at the longest row.

    On CPU, attention over a pack is sdpa with a dense block-causal mask, whose cost grows with
    the square of the whole pack: four 1,400-token rows forward+backward packed took 2.95 s a row
    against 0.24 s each alone (tiny model, 1 thread, measured 2026-12-01). Capping the pack at
    the longest row keeps every micro-batch's attention no bigger than that row's own, while
    short rows still share. GPUs keep the configured budget; there the pack is free only with a
    varlen kernel (flash_attention_2/3 installed): transformers' sdpa builds the same dense
    N x N block-causal mask on GPU, so its attention also grows with the square of the pack.
    """
    if rows and next(model.parameters()).device.type == "cpu":
        return max(1, min(budget, max(len(r.input_ids) for r in rows)))
    return budget


# Unsharded gradients may take at most this share of a GPU before "auto" reduces per micro-batch.
DEFERRED_GRAD_SHARE = 0.25


def defer_grad_sync(model: torch.nn.Module, setting: bool | str, device: torch.device) -> bool:
    """Whether FSDP2 should hold gradients unsharded until the step's last micro-batch.

    `setting` is `reduce_grads_per_microbatch`. Holding them costs the compute dtype's bytes for
    every parameter on every GPU; "auto" defers only where that fits in DEFERRED_GRAD_SHARE of
    the device's memory (on the CPU, where the test models are small, it always defers).
    """
    if setting is True:
        return False
    if setting is False or device.type != "cuda":
        return True
    held = sum(p.numel() for p in model.parameters()) * 2  # bf16/fp16 unsharded gradients
    return held <= DEFERRED_GRAD_SHARE * torch.cuda.get_device_properties(device).total_memory


def device_sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously); nothing to do on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_step(trainer: Any, inp: StepInput | None) -> dict[str, float] | None:
    """One trainer step on every rank. Returns the step's metrics (None when told to stop)."""
    args, dist_info, state = trainer.args, trainer.dist, trainer.state
    t_start = time.perf_counter()

    # 1. Every rank gets rank 0's rows (on the control group: the others may wait long here).
    inp = broadcast_object(inp, dist_info, control=True)
    if inp is None:
        return None

    # 2. Staleness, per trainable token, against the version about to be updated.
    masks, stale = apply_staleness(inp.rows, state.policy_version, args.max_staleness,
                                   args.staleness_rule)

    # 3. Pack padding-free micro-batches; this rank takes every world_size-th one, and ranks
    #    are padded to the same count with zero-weight micro-batches (FSDP needs lock-step).
    if args.prefix_sharing:  # prefix sharing (issue 30): a group's rows stay on one rank
        per_rank_mbs, pack = pack_tree(inp.rows, masks, inp.advantages,
                                       budget=args.max_tokens_per_microbatch,
                                       norm=args.loss_norm, world_size=dist_info.world_size)
        mine: list[MicroBatch] = per_rank_mbs[dist_info.rank]
    else:
        mbs, pack = pack_rows(inp.rows, masks, inp.advantages,
                              budget=_pack_budget(trainer.model, inp.rows,
                                                  args.max_tokens_per_microbatch),
                              norm=args.loss_norm)
        mine = mbs[dist_info.rank::dist_info.world_size]
        per_rank = math.ceil(len(mbs) / dist_info.world_size)
        mine += [MicroBatch.empty() for _ in range(per_rank - len(mine))]
    metrics: dict[str, float] = {**stale.metrics(), **pack.metrics()}
    t_prepared = time.perf_counter()

    # 4. Forward/backward every micro-batch, accumulating gradients and stat sums. The sums stay
    #    on the device (no host sync per micro-batch); under FSDP2 gradients are reduce-scattered
    #    once, after the last micro-batch (earlier ones accumulate unsharded gradients locally:
    #    one reduce-scatter a step instead of one per micro-batch, for the memory of the
    #    unsharded gradients; `reduce_grads_per_microbatch` decides, see config.py).
    t_compute = 0.0
    sums = dict.fromkeys(STAT_KEYS, 0.0)
    loss_total = 0.0
    # enable_grad: grad mode is per-thread state, and this runs on a worker thread that other
    # code (a weight push, an evaluation) may have left in no_grad.
    if pack.trainable_tokens > 0:
        torch.set_grad_enabled(True)
        trainer.model.train()
        trainer.optimizer.zero_grad(set_to_none=True)
        no_sync = getattr(trainer.model, "set_requires_gradient_sync", None)  # FSDP2 only
        if no_sync is not None and not defer_grad_sync(
                trainer.model, args.reduce_grads_per_microbatch, dist_info.device):
            no_sync = None
        acc = torch.zeros(1 + len(STAT_KEYS), dtype=torch.float64, device=dist_info.device)
        t0 = time.perf_counter()
        for i, mb in enumerate(mine):
            if no_sync is not None:
                no_sync(i == len(mine) - 1)
            mb = mb.to(dist_info.device)
            logp, entropy = microbatch_logprobs(trainer.model, mb, args.temperature,
                                                autocast=trainer.autocast_dtype,
                                                logits_chunk=args.logits_chunk_tokens)  # [K], [K]
            ref_logp = None
            if args.beta > 0:
                with torch.no_grad():
                    ref_logp, _ = microbatch_logprobs(trainer.ref_model, mb, args.temperature,
                                                      with_entropy=False,
                                                      autocast=trainer.autocast_dtype,
                                                      logits_chunk=args.logits_chunk_tokens)
            loss, stats = policy_loss(
                logp, mb.behaviour_logprobs, mb.advantages, mb.token_weight,
                loss_type=args.loss_type, epsilon=args.epsilon, epsilon_high=args.epsilon_high,
                is_cap=args.is_cap, beta=args.beta, ref_logp=ref_logp, entropy=entropy,
                stats_tensor=True,
            )
            # FSDP averages gradients over ranks, but token_weight already normalises over the
            # whole step (all ranks), so each rank's share must be summed: undo the average.
            # tree_backward: .backward(), except that a carried prefix trunk runs backward once,
            # after the last micro-batch that attends to it (prefix sharing, issue 30)
            tree_backward(mb, loss * dist_info.world_size if dist_info.distributed else loss)
            acc[0] += loss.detach().double()
            acc[1:] += stats.to(acc.device)
        # The clock stops when the device has run the backward, not when the host queued it.
        device_sync(dist_info.device)
        t_compute = time.perf_counter() - t0

        # 5. Add the ranks' sums up, clip, and take ONE optimizer step: version v -> v + 1.
        #    The sums cross on the process group's device (NCCL has no CPU tensors).
        if dist_info.distributed:
            dist.all_reduce(acc)
        loss_total, *vals = acc.tolist()
        sums = dict(zip(STAT_KEYS, vals, strict=True))
        t0 = time.perf_counter()
        max_norm = args.max_grad_norm if args.max_grad_norm is not None else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        # Both numbers are the same on every rank (all-reduced), so every rank decides alike.
        updated = math.isfinite(loss_total) and math.isfinite(grad_norm)
        if updated:
            trainer.optimizer.step()
            trainer.scheduler.step()
            state.policy_version += 1
        else:
            state.nonfinite_steps += 1
            if dist_info.is_main:
                log.warning("step %d: loss %r, grad norm %r: not finite, so no update (version "
                            "stays %d, nothing goes to the engine); %d such step(s) so far",
                            state.step, loss_total, grad_norm, state.policy_version,
                            state.nonfinite_steps)
        trainer.optimizer.zero_grad(set_to_none=True)
        device_sync(dist_info.device)
        t_optim = time.perf_counter() - t0
        metrics["grad_norm"] = grad_norm
        metrics["steps/empty"] = 0.0
    else:
        # Nothing trainable (every group skipped or every token dropped): no update, same version.
        updated = False
        t_optim = 0.0
        metrics["steps/empty"] = 1.0
    metrics["steps/nonfinite_skipped"] = float(pack.trainable_tokens > 0 and not updated)
    metrics["steps/nonfinite_total"] = float(state.nonfinite_steps)
    state.step += 1

    # 6. Weights to the engine (streamed, one parameter at a time), then the version to the proxy.
    t0 = time.perf_counter()
    if inp.sync and updated:
        push_weights(trainer, state.policy_version)
    if dist_info.is_main and trainer.on_version is not None and updated:
        trainer.on_version(state.policy_version)
    t_sync = time.perf_counter() - t0

    n = max(sums["tokens"], 1.0)
    t_total = time.perf_counter() - t_start
    metrics.update({
        "loss": loss_total,
        "policy/ratio_mean": sums["ratio"] / n,
        "policy/clip_low_frac": sums["clip_low"] / n,
        "policy/clip_high_frac": sums["clip_high"] / n,
        "policy/clip_frac": (sums["clip_low"] + sums["clip_high"]) / n,
        "policy/truncated_frac": sums["truncated"] / n,
        "policy/kl_behaviour_k3": sums["kl_behaviour"] / n,
        "policy/abs_logp_diff": sums["abs_logp_diff"] / n,
        "policy/entropy": sums["entropy"] / n,
        "lr": trainer.scheduler.get_last_lr()[0],
        "version": float(state.policy_version),
        "checkpoint": float(inp.save),
        "time/prepare_s": t_prepared - t_start,
        "time/forward_backward_s": t_compute,
        "time/optimizer_s": t_optim,
        "time/weight_sync_s": t_sync,
        "time/step_s": t_total,
        "time/overhead_frac": max(t_total - t_compute - t_optim - t_sync, 0.0) / max(t_total, 1e-9),
    })
    if args.beta > 0:
        metrics["policy/kl_ref_k3"] = sums["kl_ref"] / n
    return metrics


def push_weights(trainer: Any, version: int) -> None:
    """Every rank: stream the full parameters; rank 0's WeightSync sends them to the engine.

    Rank 0 hands a `FullModelView` to its WeightSync, which reads it parameter by parameter; the
    other ranks run the same gathers (`finish`). A push that raises on rank 0 propagates: the
    others are then left in a gather and end with the run (trainer/distributed.py)."""
    # LoRA: the adapters alone (the frozen base is already in the engine)
    view = FullModelView(trainer.model, trainer.compute_dtype,
                         trainable_only=trainer.args.lora_rank > 0)
    if trainer.dist.is_main:
        trainer.weight_sync.push(view, version)
    unread = view.finish() if trainer.dist.distributed else 0
    if trainer.dist.is_main and unread:
        log.warning("the weight sync read %d parameter(s) fewer than the model has; the engine "
                    "may serve a partial update of version %d", unread, version)
