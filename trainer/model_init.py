"""Build the policy (and reference) model so no rank ever holds a whole fp32 copy of it.

Why: the first version loaded the full fp32 model onto every GPU and then sharded it, so a 32B
policy needed 128 GB on each GPU and ~1 TB of host RAM across 8 ranks, and `beta > 0`
deep-copied it on the GPU for the reference model (issue 30).

Under torchrun (more than one rank), from a directory of safetensors files:

1. the model is built from its config on the meta device (no storage at all);
2. FSDP2 shards it (`trainer.distributed.shard_model`: each decoder layer, then the root);
3. `to_empty` gives each rank storage for its own shards only;
4. each rank reads only its rows of every tensor from the files (`safe_open(...).get_slice`),
   at the row offset of its FSDP2 shard (dim-0 chunks of ceil(rows / world) rows, as
   `torch.chunk`), so host memory per rank is about its shard plus one slice;
5. non-persistent buffers (rotary `inv_freq`), which `to_empty` left uninitialised and which
   are in no file, are recomputed by rebuilding their module from the config on the CPU.

The reference model goes the same way in the compute dtype (it never steps, so it needs no fp32
master copy), sharded, never copied on the GPU. Tied embeddings stay tied: the tie is made on the
meta model, FSDP2 shards the shared parameter once, and the file's `lm_head.weight` (absent
when tied) is not needed. A single process keeps the plain `from_pretrained` load.

Not covered: a model given as an `nn.Module` (it is already in memory on every rank; it is
sharded as given, and its reference copy is made on the CPU before sharding), checkpoints other
than safetensors (.bin), and tensor names that transformers renames while loading (Qwen3, Llama
and most decoder-only models keep the file's names; a name missing from the files is an error).
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import torch

from trainer.distributed import DistInfo, shard_model

__all__ = [
    "build_model",
    "build_reference",
    "enable_gradient_checkpointing",
    "load_sharded_safetensors",
    "shard_rows",
]

log = logging.getLogger(__name__)


def shard_rows(rows: int, rank: int, world: int) -> tuple[int, int]:
    """[start, end) of dim 0 that FSDP2's Shard(0) gives `rank` (torch.chunk semantics)."""
    per = -(-rows // world)  # ceil
    start = min(rank * per, rows)
    return start, min(start + per, rows)


def _weight_files(path: Path) -> dict[str, Path]:
    """tensor name -> safetensors file holding it."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: path / fname for name, fname in weight_map.items()}
    single = path / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            return dict.fromkeys(f.keys(), single)
    raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json; the "
                            "sharded load reads safetensors only (convert .bin checkpoints)")


def _recompute_buffers(model: torch.nn.Module) -> None:
    """Non-persistent buffers are in no file and `to_empty` left them garbage: rebuild them."""
    persistent = set(model.state_dict().keys())
    for mod_name, module in model.named_modules():
        names = [n for n, _ in module.named_buffers(recurse=False)
                 if (f"{mod_name}.{n}" if mod_name else n) not in persistent]
        if not names:
            continue
        config = getattr(module, "config", None)
        if config is None:
            raise TypeError(f"{mod_name} ({type(module).__name__}) has non-persistent buffers "
                            f"{names} that the meta-device load cannot recompute (the module has "
                            "no config to rebuild it from); load this model on one process")
        with torch.device("cpu"):
            fresh = type(module)(config)
        for n in names:
            getattr(module, n).copy_(getattr(fresh, n))
        for attr, value in vars(fresh).items():  # e.g. rotary attention_scaling (a float)
            if not attr.startswith("_") and isinstance(value, (int, float)) \
                    and not isinstance(value, bool):  # not `training`
                setattr(module, attr, value)


@torch.no_grad()
def load_sharded_safetensors(model: torch.nn.Module, path: str | Path) -> dict[str, int]:
    """Fill a `to_empty` (FSDP2-sharded or plain) model from safetensors, each rank its rows.

    Returns {"bytes_read": ..., "tensors": ...} for this rank. Raises naming any parameter or
    persistent buffer the files lack, or whose shape differs."""
    from safetensors import safe_open

    path = Path(path)
    files = _weight_files(path)
    wanted: dict[str, torch.Tensor] = dict(model.named_parameters())  # tied: listed once
    for name, buf in model.named_buffers():
        if name in model.state_dict():
            wanted[name] = buf
    missing = sorted(n for n in wanted if n not in files)
    if missing:
        raise KeyError(f"{path}: the safetensors files lack {missing[:5]} "
                       f"({len(missing)} in all); is this the model's own checkpoint?")
    by_file: dict[Path, list[str]] = {}
    for name in wanted:
        by_file.setdefault(files[name], []).append(name)
    read = 0
    for fpath, names in by_file.items():
        with safe_open(str(fpath), framework="pt") as f:
            for name in names:
                target = wanted[name]
                sl = f.get_slice(name)
                shape = tuple(sl.get_shape())
                if shape != tuple(target.shape):
                    raise ValueError(f"{name}: file shape {shape} != model shape "
                                     f"{tuple(target.shape)} ({fpath.name})")
                local = target.to_local() if hasattr(target, "to_local") else target
                if hasattr(target, "to_local") and local.shape != target.shape:
                    mesh = target.device_mesh
                    start, end = shard_rows(shape[0], mesh.get_local_rank(), mesh.size())
                    part = sl[start:end] if end > start else None
                else:
                    part = sl[:] if shape else f.get_tensor(name)
                if part is not None:
                    if part.shape != local.shape:
                        raise ValueError(f"{name}: read {tuple(part.shape)} for a local shard of "
                                         f"{tuple(local.shape)}; unexpected FSDP placement")
                    local.copy_(part.to(local.dtype))
                    read += part.numel() * part.element_size()
    return {"bytes_read": read, "tensors": len(wanted)}


def _meta_sharded(path: Path, dist_info: DistInfo, param_dtype: torch.dtype,
                  compute_dtype: torch.dtype | None) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=param_dtype)
    shard_model(model, compute_dtype)
    model.to_empty(device=dist_info.device)
    stats = load_sharded_safetensors(model, path)
    _recompute_buffers(model)
    if dist_info.is_main:
        log.info("sharded load of %s (%s): rank 0 read %.1f MiB of %d tensors", path,
                 param_dtype, stats["bytes_read"] / 2**20, stats["tensors"])
    return model


def build_model(model: str | Path | torch.nn.Module, dist_info: DistInfo,
                compute_dtype: torch.dtype) -> torch.nn.Module:
    """The fp32 policy on `dist_info.device`, sharded under torchrun (see the module doc)."""
    if isinstance(model, torch.nn.Module):
        model = model.float().to(dist_info.device)
        return shard_model(model, compute_dtype) if dist_info.distributed else model
    path = Path(model)
    if dist_info.distributed and path.is_dir():
        return _meta_sharded(path, dist_info, torch.float32, compute_dtype)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    loaded.to(dist_info.device)
    return shard_model(loaded, compute_dtype) if dist_info.distributed else loaded


def build_reference(source: str | Path | torch.nn.Module, dist_info: DistInfo,
                    compute_dtype: torch.dtype) -> torch.nn.Module:
    """The frozen initial policy in the compute dtype, built like the policy (never a GPU copy).

    `source` is what the policy is built from; for an nn.Module, call this BEFORE `build_model`
    (it copies the module's weights where they are: on the CPU for a module not yet placed)."""
    if isinstance(source, torch.nn.Module):
        ref = copy.deepcopy(source).to(compute_dtype)  # where `source` is: CPU until built
    else:
        path = Path(source)
        if dist_info.distributed and path.is_dir():
            ref = _meta_sharded(path, dist_info, compute_dtype, None)
            return ref.eval().requires_grad_(False)
        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(str(source), dtype=compute_dtype)
    if dist_info.distributed:
        shard_model(ref)  # FSDP2 moves each rank's shards to the device
    ref.to(dist_info.device)
    return ref.eval().requires_grad_(False)


def enable_gradient_checkpointing(model: torch.nn.Module, setting: bool | str,
                                  device: torch.device) -> tuple[bool, str]:
    """Per-decoder-layer activation checkpointing; returns (on, why) for the start-up log.

    Non-reentrant checkpointing (torch's recommended mode; it also works when no input needs a
    gradient). transformers >= 5.24 checkpoints each layer's `forward`, so FSDP2's hooks stay
    outside the recompute (tests/test_trainer_sharded_load.py checks gradients under FSDP2)."""
    on = device.type == "cuda" if setting == "auto" else bool(setting)
    why = f"gradient_checkpointing={setting!r} on {device.type}"
    if not on:
        return False, why + ": off (every layer keeps its activations)"
    enable = getattr(model, "activation_checkpointing_enable", None)
    kwargs = {"use_reentrant": False}
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):  # transformers < 5.24
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise TypeError(f"gradient_checkpointing={setting!r}: {type(model).__name__} has no "
                        "activation_checkpointing_enable; set gradient_checkpointing=false")
    return True, why + ": on (each decoder layer recomputed in backward)"
