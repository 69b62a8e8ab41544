"""What the trainer sends: its parameters under their checkpoint names, gathered when sharded.

vLLM's `load_weights` expects checkpoint (Hugging Face) names such as
`model.layers.0.self_attn.q_proj.weight`, whole tensors, and it shards them itself. A trainer model
can carry wrapper prefixes (`module.` from DDP, `_orig_mod.` from torch.compile,
`_checkpoint_wrapped_module.` from activation checkpointing) and, under FSDP2, DTensor shards.
This module strips the prefixes and gathers the shards (`DTensor.full_tensor()`, a collective
that every rank must run in the same order: callers iterate on every rank, only rank 0 sends).

Tied weights: `named_parameters()` yields a tied tensor once (under its first name, usually
`model.embed_tokens.weight`), and vLLM's models skip `lm_head.weight` when tied, as they do when
loading the checkpoint. Buffers (rotary caches) are not sent: vLLM recomputes its own.

Streaming, never the whole model at once: `iter_full_parameters` gathers ONE parameter, hands it
on, and only then gathers the next, so the peak is one full tensor on the parameters' device
(a GPU under NCCL, which is where vLLM's NCCL engine wants it), never a full state dict on the
CPU. `FullModelView` is the trainer's handle on that stream: rank 0 gives it to its WeightSync,
the other ranks drain the same gathers in the same order (`finish()`), and a cast to the
engine's dtype (bf16 master-weight training keeps fp32 parameters) happens on each shard
before its gather, so half the bytes cross.

What it does not do: rename parameters of custom architectures (pass `name_map` to
`VLLMWeightSync`). PEFT adapters go another way: `FullModelView(..., trainable_only=True)` streams
the adapters alone, under the peft model's names, to `LoRAWeightSync` (trainer/weight_sync/lora.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainer.weight_sync.wire import TensorMeta, dtype_name

__all__ = [
    "FullModelView",
    "NameMap",
    "checkpoint_name",
    "iter_full_parameters",
    "parameter_metas",
]

NameMap = Callable[[str], str]

_WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


def checkpoint_name(name: str) -> str:
    """`module._orig_mod.model.layers.0.mlp.up_proj.weight` -> `model.layers.0.mlp.up_proj.weight`."""
    parts = [part for part in name.split(".") if part not in _WRAPPER_SEGMENTS]
    return ".".join(parts)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)  # FSDP2 DTensor: all-gather (collective)
    return full_tensor() if callable(full_tensor) else tensor


def parameter_metas(model: Any, name_map: NameMap | None = None) -> list[TensorMeta]:
    """Name, dtype and full shape of each parameter, without gathering (DTensor shapes are global).

    A `FullModelView` describes itself (its stream can be read only once, and its dtype is the
    cast one)."""
    rename = name_map or checkpoint_name
    describe = getattr(model, "describe_parameters", None)
    if callable(describe):
        items = describe()
    else:
        items = [(name, p.dtype, tuple(p.shape)) for name, p in model.named_parameters()]
    return [TensorMeta(rename(name), dtype_name(dtype), tuple(shape)) for name, dtype, shape in items]


def iter_full_parameters(
    model: torch.nn.Module, name_map: NameMap | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(checkpoint name, full tensor)` in `named_parameters()` order. Collective under FSDP2."""
    rename = name_map or checkpoint_name
    for name, param in model.named_parameters():
        with torch.no_grad():  # not around the yield: see FullModelView._gather
            full = _full(param.detach())
        yield rename(name), full


class FullModelView:
    """The trainer's model as a WeightSync sees it: full parameters, streamed one at a time.

    `named_parameters()` yields `(name, full tensor)` in the model's order; under FSDP2 each
    element is a gather (`DTensor.full_tensor()`, a collective), so the stream can be read ONCE
    per push, and every rank must run the same gathers: rank 0 hands the view to its WeightSync,
    the other ranks call `finish()`, which drains what was not read. `describe_parameters()` gives
    names, dtypes and shapes without gathering. `dtype` (e.g. bfloat16 for an engine serving
    bf16 while the trainer keeps fp32 master weights) casts each shard before its gather.

    It has no `state_dict()`: that would hold every tensor at once.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None = None, *,
                 trainable_only: bool = False) -> None:
        self.model = model
        self.dtype = dtype
        # LoRA (trainer/lora.py): only the adapters change, so only they are gathered and sent
        self.trainable_only = trainable_only
        self.config = getattr(model, "config", None)
        self._stream: Iterator[tuple[str, torch.Tensor]] | None = None
        self.read = 0  # parameters handed out so far (by the stream or by finish())

    def _params(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        for name, p in self.model.named_parameters():
            if p.requires_grad or not self.trainable_only:
                yield name, p

    def _cast(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.dtype is not None and tensor.is_floating_point() and tensor.dtype != self.dtype:
            return tensor.to(self.dtype)  # on the shard: a DTensor stays sharded
        return tensor

    def describe_parameters(self) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
        out = []
        for name, p in self._params():
            dtype = self.dtype if self.dtype is not None and p.is_floating_point() else p.dtype
            out.append((name, dtype, tuple(p.shape)))
        return out

    def _gather(self) -> Iterator[tuple[str, torch.Tensor]]:
        # no_grad around each gather, never around a yield: grad mode is per-thread global state,
        # and a generator suspended inside no_grad leaves the consumer's thread without autograd
        # (the next training step's backward then fails, or worse, a caller that reads only part
        # of the stream trains nothing).
        for name, param in self._params():
            with torch.no_grad():
                full = _full(self._cast(param.detach()))
            self.read += 1
            yield name, full
            del full  # the caller has consumed it: only one full tensor alive at a time

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        if self._stream is not None:
            raise RuntimeError(
                "FullModelView.named_parameters() can be read once per push: each element is a "
                "collective gather that every rank runs once. Keep what you need from the first "
                "pass (use describe_parameters() for names, dtypes and shapes)."
            )
        self._stream = self._gather()
        return self._stream

    def parameters(self) -> Iterator[torch.Tensor]:
        for _, tensor in self.named_parameters():
            yield tensor

    def finish(self) -> int:
        """Run the gathers nobody read (all of them on ranks other than 0); returns how many."""
        stream = self._stream if self._stream is not None else self.named_parameters()
        before = self.read
        for _ in stream:
            pass
        return self.read - before
