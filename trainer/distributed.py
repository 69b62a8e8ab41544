"""More than one process: torchrun + FSDP2 (`fully_shard`), decided once at start-up.

    torchrun --nproc-per-node 2 my_train.py          # CPU: gloo; GPU: nccl, one GPU per rank

What is decided here, once, with the reason logged (nanochat's common.py habit):
- device: cuda:<LOCAL_RANK> when CUDA is available, else cpu;
- backend: nccl on CUDA, gloo on CPU;
- sharding: each decoder layer is its own FSDP2 unit, then the root (so all-gathers overlap
  per layer); a single process is never wrapped.

Rank 0 owns everything that talks to the outside: it runs the rollout producer, broadcasts each
step's rows to the other ranks, writes metrics and checkpoints, and pushes weights to the engine.
The other ranks only step. Weight sync gathers full parameters to rank 0 (`full_state_dict`,
a collective every rank must enter) and hands rank 0 a `FullModelView`, which quacks like the
model for a WeightSync (`named_parameters()`, `state_dict()`, `config`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "FullModelView",
    "broadcast_object",
    "full_state_dict",
    "init_distributed",
    "shard_model",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    reason: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def init_distributed() -> DistInfo:
    """Join the torchrun process group if launched by torchrun; otherwise a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        backend, why = "nccl", "CUDA is available"
    else:
        device = torch.device("cpu")
        backend, why = "gloo", "no CUDA device: CPU training with gloo collectives"
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend=backend)
    reason = f"device={device} ({why})" + (f", {world} ranks over {backend}" if world > 1 else "")
    if rank == 0:
        log.info("trainer placement: %s", reason)
    return DistInfo(rank, world, local, device, reason)


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2: each decoder layer, then the root. Returns the same (now sharded) module."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", model), "layers", None)
    for layer in layers or ():
        fully_shard(layer)
    fully_shard(model)
    return model


def full_state_dict(model: torch.nn.Module, dist_info: DistInfo) -> dict[str, torch.Tensor] | None:
    """Full (unsharded) CPU state dict on rank 0, None on other ranks. Collective when sharded."""
    if not dist_info.distributed:
        return {k: v.detach() for k, v in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                              cpu_offload=True))
    return sd if dist_info.is_main else None


class FullModelView:
    """What a WeightSync receives under FSDP on rank 0: gathered full tensors, the model's config.

    Exposes `named_parameters()`, `state_dict()` and `config` like the HF model, so a weight sync
    written for a single process works unchanged.
    """

    def __init__(self, state: dict[str, torch.Tensor], model: torch.nn.Module):
        self._state = state
        self.config = getattr(model, "config", None)
        self._param_names = {n for n, _ in model.named_parameters()}

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._state.items():
            if name in self._param_names:
                yield name, tensor

    def parameters(self) -> Iterator[torch.Tensor]:
        for _, t in self.named_parameters():
            yield t

    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._state)


def broadcast_object(obj: Any, dist_info: DistInfo) -> Any:
    """Rank 0's `obj` on every rank (identity on a single process)."""
    if not dist_info.distributed:
        return obj
    box = [obj if dist_info.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
