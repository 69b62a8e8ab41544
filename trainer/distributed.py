"""More than one process: torchrun + FSDP2 (`fully_shard`), decided once at start-up.

    torchrun --nproc-per-node 2 my_train.py          # CPU: gloo; GPU: nccl, one GPU per rank

What is decided here, once, with the reason logged (nanochat's common.py habit), and nowhere
else (the loop has no CPU or GPU branch: the same code runs on gloo in the tests and on NCCL):
- device: cuda:<LOCAL_RANK> when CUDA is available, else cpu;
- backend: "cpu:gloo,cuda:nccl" on CUDA (each tensor goes to the backend of its device: the
  step's tensors are on the GPU and cross on NCCL, pickled objects cross on gloo), "gloo" on CPU;
- start-up: `init_distributed` may be called early (harness.train joins every rank before rank
  0 starts its engine and evaluation) and again by the trainer, which then gets the same groups;
  the trainer's first act is `wait_for_all_ranks` on the control group, so the followers wait
  for a late rank 0 there, never on the short step timeout;
- two groups: the default one for the step's collectives, with a bounded timeout
  (`dist_timeout_s`), and a gloo "control" group through which rank 0 hands each step's rows to
  the others. The control group waits longer (`step_wait_timeout_s`), because the other ranks
  wait there while rank 0 waits for agent rollouts, which take minutes;
- sharding: each decoder layer is its own FSDP2 unit, then the root (so all-gathers overlap
  per layer); with a bf16 compute dtype every unit gets MixedPrecisionPolicy(param bf16,
  reduce fp32): parameters and optimizer state stay fp32 (the master weights), the all-gather
  and the forward run in bf16, and gradients are reduced in fp32. A single process is never
  wrapped; it uses autocast instead (trainer/grpo.py).

Failure: a rank that raises leaves its process (the trainer never runs a clean-up collective
after an error, which would block on peers that are elsewhere), and the launcher ends the others:
torchrun's agent stops every worker when one exits non-zero and reports the first failure
("Root Cause"), as does torch.multiprocessing.spawn. A rank that hangs instead is ended by the
timeouts above. `fail_fast` logs the first error with its rank before that happens.

Rank 0 owns everything that talks to the outside: it runs the rollout producer, broadcasts each
step's rows to the other ranks, writes metrics and checkpoints, and pushes weights to the engine.
Weight sync streams full parameters one at a time (`FullModelView`, trainer/weight_sync/source.py):
rank 0's WeightSync reads the stream while the other ranks run the same gathers.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from trainer.weight_sync.source import FullModelView

__all__ = [
    "DistInfo",
    "FullModelView",
    "broadcast_object",
    "fail_fast",
    "full_state_dict",
    "init_distributed",
    "placement",
    "shard_model",
    "wait_for_all_ranks",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    reason: str
    backend: str = ""  # what init_process_group got ("" on a single process)
    control_group: Any = None  # gloo group for rank 0's step inputs (None on a single process)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def placement(cuda_available: bool, local_rank: int) -> tuple[torch.device, str, str]:
    """(device, process-group backend, why): the one place the CPU and GPU runs differ."""
    if cuda_available:
        return (torch.device("cuda", local_rank), "cpu:gloo,cuda:nccl",
                "CUDA is available: GPU tensors on NCCL, pickled objects on gloo")
    return torch.device("cpu"), "gloo", "no CUDA device: CPU training with gloo collectives"


def init_distributed(dist_timeout_s: float = 600.0,
                     step_wait_timeout_s: float = 6 * 3600.0) -> DistInfo:
    """Join the torchrun process group if launched by torchrun; otherwise a single process.

    `dist_timeout_s` bounds every collective of a step (a hung rank ends the others after it);
    `step_wait_timeout_s` bounds how long ranks other than 0 wait for rank 0's next step.
    """
    global _JOINED
    if _JOINED is not None and dist.is_initialized() and _JOINED[0] is dist.group.WORLD:
        return _JOINED[1]  # joined already (harness.train joins before its long start-up)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device, backend, why = placement(torch.cuda.is_available(), local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    control = None
    if world > 1:
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=dist_timeout_s))
        else:
            backend = str(dist.get_backend())
            why += f" (process group initialised by the caller: {backend})"
        # A collective: every rank creates it, in the same order.
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=step_wait_timeout_s))
    reason = f"device={device} ({why})"
    if world > 1:
        reason += (f", {world} ranks over {backend}, step collectives time out after "
                   f"{dist_timeout_s:g} s, followers wait {step_wait_timeout_s:g} s for a step")
    if rank == 0:
        log.info("trainer placement: %s", reason)
    info = DistInfo(rank, world, local, device, reason, backend if world > 1 else "", control)
    if world > 1:
        _JOINED = (dist.group.WORLD, info)
    return info


# (the default group it was made for, the DistInfo): a second init_distributed in the same
# process group returns the first one's groups instead of creating another control group.
_JOINED: tuple[Any, DistInfo] | None = None


def wait_for_all_ranks(dist_info: DistInfo, what: str) -> None:
    """Every rank waits here until all have arrived, for up to `step_wait_timeout_s`.

    Rank 0 may arrive minutes after the others: it starts the engine, the rollout service and
    the held-out "before" evaluation first. The wait is on the control group (gloo, long
    timeout), so the step collectives' short `dist_timeout_s` never covers it, and a rank that
    never comes is named in the error (monitored_barrier)."""
    if not dist_info.distributed:
        return
    t0 = time.monotonic()
    dist.monitored_barrier(group=dist_info.control_group, wait_all_ranks=True)
    waited = time.monotonic() - t0
    if waited > 1.0:
        log.info("rank %d waited %.0f s for every rank (%s)", dist_info.rank, waited, what)


def shard_model(model: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """FSDP2: each decoder layer, then the root. Returns the same (now sharded) module.

    With a `compute_dtype` other than the parameters' own, FSDP2 gathers and computes in it and
    reduces gradients in fp32; the sharded parameters (what the optimizer steps) keep their dtype.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    # The trainable parameters' dtype: with LoRA the frozen base is already in the compute dtype
    # while the fp32 adapters must still be gathered in it and reduced in fp32 (trainer/lora.py).
    trainable = [p for p in model.parameters() if p.requires_grad]
    param_dtype = (trainable or list(model.parameters()))[0].dtype
    if compute_dtype is not None and compute_dtype != param_dtype:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype,
                                                   reduce_dtype=torch.float32)
    # a peft model (LoRA) wraps the HF model twice: shard the same decoder layers inside it
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(inner, "model", inner), "layers", None)
    for layer in layers or ():
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_state_dict(model: torch.nn.Module, dist_info: DistInfo) -> dict[str, torch.Tensor] | None:
    """Full (unsharded) CPU state dict on rank 0, None on other ranks. Collective when sharded.

    For checkpoints only (a file needs the whole state dict); weight sync streams instead."""
    if not dist_info.distributed:
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    return sd if dist_info.is_main else None


def broadcast_object(obj: Any, dist_info: DistInfo, *, control: bool = False) -> Any:
    """Rank 0's `obj` on every rank (identity on a single process).

    `control=True` uses the control group (long wait: rank 0 may be waiting for rollouts)."""
    if not dist_info.distributed:
        return obj
    box = [obj if dist_info.is_main else None]
    group = dist_info.control_group if control else None
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def fail_fast(dist_info: DistInfo, exc: BaseException) -> None:
    """Log a rank's error before its process leaves (the launcher then ends the other ranks)."""
    if dist_info.distributed:
        log.error("rank %d of %d failed: %s: %s; leaving without further collectives, the "
                  "launcher (torchrun) ends the other ranks", dist_info.rank,
                  dist_info.world_size, type(exc).__name__, exc)
