"""Build the policy (and reference) model so no rank ever holds a whole fp32 copy of it.

Why: the first version loaded the full fp32 model onto every GPU and then sharded it, so a 32B
policy needed 128 GB on each GPU and ~1 TB of host RAM across 8 ranks, and `beta > 0`
deep-copied it on the GPU for the reference model (issue 30).

Under torchrun (more than one rank), from a directory of safetensors files:

1. the model is built from its config on the meta device (no storage at all);
2. FSDP2 shards it (`trainer.distributed.shard_model`: each decoder layer, then the root);
3. `to_empty` gives each rank storage for its own shards only;
4. each rank reads only its rows of every tensor from the files, at the row offset of its
   FSDP2 shard (dim-0 chunks of ceil(rows / world) rows, as `torch.chunk`), with plain reads at
   offsets from the safetensors header rather than safetensors' mmap (whose touched pages count
   in every rank's resident memory); host memory per rank is its shard plus one 16 MiB staging block;
5. non-persistent buffers (rotary `inv_freq`), which `to_empty` left uninitialised and which
   are in no file, are recomputed by rebuilding their module from the config on the CPU.

The reference model goes the same way in the compute dtype (it never steps, so it needs no fp32
master copy), sharded, never copied on the GPU. Tied embeddings stay tied: the tie is made on the
meta model, FSDP2 shards the shared parameter once, and the file's `lm_head.weight` (absent
when tied) is not needed. A single process keeps the plain `from_pretrained` load.

Not covered: a Hub id under torchrun (loaded whole on each rank as before: download it and pass
the local directory), a model given as an `nn.Module` (already in memory on every rank; it is
sharded as given, and its reference copy is made where it lies, on the CPU before it is placed),
checkpoints other than safetensors (.bin), and tensor names that transformers renames while
loading (Qwen3, Llama and most decoder-only models keep the file's names; a name missing from
the files is an error).
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
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


# safetensors dtype names (the format's header) -> torch dtypes
_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
           "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # absolute byte offset of the tensor's data in the file


def _header(fpath: Path) -> dict[str, _Entry]:
    """A safetensors file's tensors: 8-byte little-endian header size, JSON header, data."""
    with open(fpath, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise ValueError(f"{fpath.name}: {name} has dtype {meta['dtype']}, which the "
                             "sharded load does not read")
        out[name] = _Entry(fpath, _DTYPES[meta["dtype"]], tuple(meta["shape"]),
                           8 + size + meta["data_offsets"][0])
    return out


def _weight_files(path: Path) -> dict[str, _Entry]:
    """tensor name -> where it is, over model.safetensors or the shards of its index."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json; "
                                "the sharded load reads safetensors only (convert .bin files)")
    entries: dict[str, _Entry] = {}
    for fname in files:
        entries.update(_header(path / fname))
    return entries


_BLOCK_BYTES = 16 * 2**20  # staging per read: bounds what a rank holds beside its shards


def _read_rows_into(entry: _Entry, start: int, end: int, out: torch.Tensor) -> int:
    """Rows [start, end) of a row-major tensor into `out` ([end - start, ...]), in blocks of at
    most _BLOCK_BYTES, with plain reads (no mmap: other ranks' rows never become this process's
    resident pages). Straight into `out` when it is a contiguous CPU tensor of the file's dtype;
    else through a staging block (cast and moved by copy_). Returns the bytes read."""
    row_elems = 1
    for d in entry.shape[1:]:
        row_elems *= d
    itemsize = torch.empty((), dtype=entry.dtype).element_size()
    row_bytes = max(row_elems * itemsize, 1)
    rows_per_block = max(1, _BLOCK_BYTES // row_bytes)
    direct = out.device.type == "cpu" and out.dtype == entry.dtype and out.is_contiguous()
    flat = out.view(end - start, row_elems) if direct else None
    with open(entry.file, "rb", buffering=0) as f:
        for r0 in range(start, end, rows_per_block):
            r1 = min(r0 + rows_per_block, end)
            if direct:
                dest = flat[r0 - start:r1 - start].view(torch.uint8).view(-1)
            else:
                dest = torch.empty((r1 - r0) * row_bytes, dtype=torch.uint8)
            f.seek(entry.offset + r0 * row_bytes)
            got = f.readinto(memoryview(dest.numpy()))
            if got != dest.numel():
                raise ValueError(f"{entry.file.name}: short read ({got} of {dest.numel()} "
                                 "bytes); the file is truncated")
            if not direct:
                block = dest.view(entry.dtype).view(r1 - r0, *entry.shape[1:])
                out[r0 - start:r1 - start].copy_(block)  # casts and moves to out's device
    return (end - start) * row_bytes


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
    persistent buffer the files lack, or whose shape differs. Beside the shards, at most one
    16 MiB staging block (file dtype, CPU) exists at a time."""
    path = Path(path)
    files = _weight_files(path)
    wanted: dict[str, torch.Tensor] = dict(model.named_parameters())  # tied: listed once
    persistent = set(model.state_dict().keys())
    wanted.update((n, b) for n, b in model.named_buffers() if n in persistent)
    missing = sorted(n for n in wanted if n not in files)
    if missing:
        raise KeyError(f"{path}: the safetensors files lack {missing[:5]} "
                       f"({len(missing)} in all); is this the model's own checkpoint?")
    read = 0
    for name, target in wanted.items():
        entry = files[name]
        if entry.shape != tuple(target.shape):
            raise ValueError(f"{name}: file shape {entry.shape} != model shape "
                             f"{tuple(target.shape)} ({entry.file.name})")
        local = target.to_local() if hasattr(target, "to_local") else target
        if hasattr(target, "to_local"):  # FSDP2: Shard(0) over a 1-D mesh
            mesh = target.device_mesh
            start, end = shard_rows(entry.shape[0], mesh.get_local_rank(), mesh.size())
        else:
            start, end = 0, entry.shape[0] if entry.shape else 0
        if not entry.shape:  # a scalar: one row of one element
            read += _read_rows_into(_Entry(entry.file, entry.dtype, (1,), entry.offset), 0, 1,
                                    local.view(1))
            continue
        if end <= start:
            continue  # this rank holds no rows of a tensor shorter than the world
        if tuple(local.shape) != (end - start, *entry.shape[1:]):
            raise ValueError(f"{name}: local shard {tuple(local.shape)} is not rows "
                             f"[{start}, {end}) of {entry.shape}; unexpected FSDP placement")
        read += _read_rows_into(entry, start, end, local)
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
