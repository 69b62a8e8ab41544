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

What it does not do: rename parameters of adapters (PEFT) or custom architectures. Pass
`name_map` to `VLLMWeightSync` for those.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from trainer.weight_sync.wire import TensorMeta, dtype_name

__all__ = ["NameMap", "checkpoint_name", "iter_full_parameters", "parameter_metas"]

NameMap = Callable[[str], str]

_WRAPPER_SEGMENTS = ("module", "_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module")


def checkpoint_name(name: str) -> str:
    """`module._orig_mod.model.layers.0.mlp.up_proj.weight` -> `model.layers.0.mlp.up_proj.weight`."""
    parts = [part for part in name.split(".") if part not in _WRAPPER_SEGMENTS]
    return ".".join(parts)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)  # FSDP2 DTensor: all-gather (collective)
    return full_tensor() if callable(full_tensor) else tensor


def parameter_metas(model: torch.nn.Module, name_map: NameMap | None = None) -> list[TensorMeta]:
    """Name, dtype and full shape of each parameter, without gathering (DTensor shapes are global)."""
    rename = name_map or checkpoint_name
    return [
        TensorMeta(rename(name), dtype_name(param.dtype), tuple(param.shape))
        for name, param in model.named_parameters()
    ]


def iter_full_parameters(
    model: torch.nn.Module, name_map: NameMap | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield `(checkpoint name, full tensor)` in `named_parameters()` order. Collective under FSDP2."""
    rename = name_map or checkpoint_name
    with torch.no_grad():
        for name, param in model.named_parameters():
            yield rename(name), _full(param.detach())
