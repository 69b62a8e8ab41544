"""Checkpoints: everything needed to continue a run exactly where its data stood.

    <output_dir>/checkpoint-<step>/
        dcp/                model + AdamW state, sharded (torch.distributed.checkpoint): each
                            rank writes its own shards, no rank ever holds the whole state
        trainer_state.pt    scheduler, step, policy version, next_group_index (the rollout
                            position), world size (rank 0)
        rng/rank-<r>.pt     each rank's RNG states
    <output_dir>/latest     name of the newest complete checkpoint
    <output_dir>/model/     HF layout (config + safetensors), exported once when training ends:
                            servable by vLLM, loadable by from_pretrained (`export_model`);
                            a LoRA run's adapter folder instead (`export_adapter`)

LoRA runs (`trainable_only=True`) leave the frozen base out of every checkpoint: the adapters and
their AdamW state are all that changes (the base is the run's --model, loaded again on resume).

Why sharded: a full checkpoint gathers the fp32 model and both AdamW moments on rank 0's CPU,
~48 GB at 4B and ~390 GB at 32B, and resume made every rank load the whole blob. With DCP each
rank writes and reads only its shard (resharded on load when the rank count changed), and saves
come every `save_steps` (and after the last step), not every step.

The rollout position is the point: groups are numbered, group g runs with seed g (on the task
its index, the seed and the epoch pick: trainer/producer.py), and the trainer consumes them in
order. A checkpoint after step s stores
the first group index not yet consumed; resuming dispatches from exactly there, so a killed run
and an uninterrupted one see the same tasks in the same steps. Groups that were in flight at the
kill are rerun, never skipped (their rollouts are lost: a rollout cannot be checkpointed
half-way through an agent's run).

A checkpoint is written to `<name>.tmp` and renamed when complete, then `latest` is rewritten:
a kill during a save leaves the previous checkpoint as latest. Under FSDP every rank writes its
shards into the same directory (a shared filesystem across nodes); DCP's own coordination and
the barriers here run on the control group (gloo, `step_wait_timeout_s`), because writing a
large model can outlast the step collectives' timeout.
"""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from trainer.checkpoint_prune import prune_checkpoints
from trainer.distributed import DistInfo, full_state_dict
from trainer.errors import CheckpointError

__all__ = ["TrainerState", "export_adapter", "export_model", "find_latest", "load_checkpoint", "save_checkpoint"]

log = logging.getLogger(__name__)


@dataclass
class TrainerState:
    step: int = 0  # trainer steps done
    policy_version: int = 0  # optimizer updates applied (the version the engine is told)
    next_group_index: int = 0  # first group not consumed by a finished step
    nonfinite_steps: int = 0  # steps skipped because the loss or gradient norm was not finite


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    # One state per visible GPU: a machine with another GPU count keeps its own CUDA RNG.
    if "cuda" in state and torch.cuda.is_available() \
            and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier(dist_info: DistInfo) -> None:
    if dist_info.distributed:
        dist.barrier(group=dist_info.control_group)


def _group(dist_info: DistInfo) -> Any:
    """DCP's coordination group: the control one (long timeout); None on a single process."""
    return dist_info.control_group if dist_info.distributed else None


@contextlib.contextmanager
def _single_process_quiet(dist_info: DistInfo) -> Iterator[None]:
    """DCP warns on every single-process save/load that it assumes one process: it is one."""
    with warnings.catch_warnings():
        if not dist_info.distributed:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_checkpoint(
    output_dir: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainerState,
    dist_info: DistInfo,
    total_limit: int | None = None,
    trainable_only: bool = False,
) -> Path:
    """Save a sharded checkpoint (every rank calls this and writes its shards). Returns its path.

    `trainable_only` (LoRA): the frozen base is left out; the checkpoint holds the adapters and
    their AdamW state (the base is the run's --model, which resume loads again)."""
    root = Path(output_dir)
    name = f"checkpoint-{state.step}"
    final = root / name
    tmp = root / f"{name}.tmp"
    if dist_info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier(dist_info)  # the directory exists before any rank writes into it
    model_sd, optim_sd = _state_dicts(model, optimizer, trainable_only)
    with _single_process_quiet(dist_info):
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp / "dcp",
                 process_group=_group(dist_info), no_dist=not dist_info.distributed)
    (tmp / "rng").mkdir(exist_ok=True)
    torch.save(_rng_state(), tmp / "rng" / f"rank-{dist_info.rank}.pt")
    _barrier(dist_info)  # every rank's RNG file is in
    if dist_info.is_main:
        torch.save({
            "state": asdict(state),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "world_size": dist_info.world_size,
        }, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (root / "latest.tmp").write_text(name)
        (root / "latest.tmp").replace(root / "latest")
        if total_limit is not None:  # by write order, never the one just written
            prune_checkpoints(root, total_limit, keep=final)
    _barrier(dist_info)  # nobody reads `latest` before it names this checkpoint
    return final


def export_model(output_dir: str | Path, *, model: torch.nn.Module, dist_info: DistInfo,
                 tokenizer: Any = None) -> Path | None:
    """The final model in HF layout at <output_dir>/model (rank 0 writes; every rank calls it).

    Under FSDP2 the full state dict is gathered to rank 0's CPU, one parameter at a time
    (get_model_state_dict(full_state_dict=True, cpu_offload=True)): host memory for one model
    copy, once per run. Written to model.tmp and renamed, so a kill leaves no half export."""
    target = Path(output_dir) / "model"
    model_sd = full_state_dict(model, dist_info)
    if dist_info.is_main:
        tmp = target.with_name("model.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp, state_dict=model_sd)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    _barrier(dist_info)
    return target if dist_info.is_main else None


def export_adapter(output_dir: str | Path, *, model: torch.nn.Module, dist_info: DistInfo,
                   tokenizer: Any = None) -> Path | None:
    """A LoRA run's final adapters at <output_dir>/model (adapter_config.json +
    adapter_model.safetensors + the tokenizer): `PeftModel.from_pretrained`, vLLM's
    --lora-modules, `harness.eval --model` and `python -m trainer.lora` (merge) all read it.
    Every rank calls it (the adapters are gathered one at a time); rank 0 writes."""
    from trainer.lora import save_adapter
    from trainer.weight_sync.source import FullModelView

    view = FullModelView(model, trainable_only=True)
    tensors = {n: t.detach().to("cpu", copy=True) for n, t in view.named_parameters()}
    target = Path(output_dir) / "model"
    if dist_info.is_main:
        save_adapter(model, tensors, target)
        if tokenizer is not None:
            tokenizer.save_pretrained(target)
    _barrier(dist_info)
    return target if dist_info.is_main else None


def find_latest(output_dir: str | Path) -> Path | None:
    pointer = Path(output_dir) / "latest"
    if not pointer.exists():
        return None
    path = Path(output_dir) / pointer.read_text().strip()
    return path if (path / "trainer_state.pt").exists() else None


def load_checkpoint(
    path: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    dist_info: DistInfo,
    trainable_only: bool = False,
) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG in place (each rank its shards); return the
    trainer state. Every rank calls this. `trainable_only`: a LoRA checkpoint (adapters only)."""
    path = Path(path)
    if not (path / "trainer_state.pt").exists() or not (path / "dcp" / ".metadata").exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (needs dcp/ and "
                              "trainer_state.pt); pass a checkpoint-<step> directory or "
                              "resume_from_checkpoint=True to use <output_dir>/latest")
    blob = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    missing_fields = sorted({"state", "scheduler", "world_size"} - set(blob))
    if missing_fields:
        raise CheckpointError(f"{path}/trainer_state.pt lacks {missing_fields}: it was not "
                              "written by this trainer's save_checkpoint")
    # Keys: from the checkpoint's metadata (no tensor read), checked on every rank against the
    # model's own (FSDP2 keeps the unwrapped names) before anything loads, so a wrong
    # checkpoint fails on all ranks alike and leaves the model untouched.
    metadata = dcp.FileSystemReader(str(path / "dcp")).read_metadata()
    saved = {k.removeprefix("model.") for k in metadata.state_dict_metadata
             if k.startswith("model.")}
    options = _options(trainable_only)
    model_sd, optim_sd = _state_dicts(model, optimizer, trainable_only)
    problem = _key_problem(path, saved, model, set(model_sd) if trainable_only else None)
    if problem:
        raise CheckpointError(problem)
    _check_world_size(path, blob["world_size"], dist_info)
    target = {"model": model_sd, "optimizer": optim_sd}
    with _single_process_quiet(dist_info):
        dcp.load(target, checkpoint_id=path / "dcp", process_group=_group(dist_info),
                 no_dist=not dist_info.distributed)
    set_state_dict(model, optimizer, model_state_dict=target["model"],
                   optim_state_dict=target["optimizer"], options=options)
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    rng = path / "rng" / f"rank-{dist_info.rank}.pt"
    if not rng.exists():  # more ranks than were saved: a new rank starts from rank 0's RNG
        rng = path / "rng" / "rank-0.pt"
    _set_rng_state(torch.load(rng, map_location="cpu", weights_only=False))
    return TrainerState(**blob["state"])


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 trainable_only: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """Model and optimizer state dicts, sharded (DTensor) under FSDP2. `trainable_only`: the
    trainable parameters' entries alone. torch's ignore_frozen_params drops frozen parameters
    but keeps a tied alias of one (a LoRA model's lm_head.weight is the frozen embedding under
    another name), so entries that are no trainable parameter are dropped here too."""
    model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(trainable_only))
    if trainable_only:
        keep = {n for n, p in model.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in keep}
    return model_sd, optim_sd


def _options(trainable_only: bool) -> StateDictOptions:
    # strict=False with trainable_only: the frozen base is absent from the checkpoint on purpose
    return StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)


def _key_problem(path: Path, saved: set[str], model: torch.nn.Module,
                 expected: set[str] | None = None) -> str | None:
    expected = set(model.state_dict()) if expected is None else expected
    tied = _tied_names(model)
    missing = sorted(expected - saved - tied)
    unexpected = sorted(saved - expected)
    if not missing and not unexpected:
        return None
    return (f"{path}: model keys differ from this model's ({len(missing)} missing, e.g. "
            f"{missing[:5]}; {len(unexpected)} unexpected, e.g. {unexpected[:5]}); was it saved "
            "from another model? Resume with the model the run was started with.")


def _check_world_size(path: Path, saved: Any, dist_info: DistInfo) -> None:
    """DCP reshards model and optimizer to another rank count on load; the loss is then summed
    in another order, so the run is not bit-identical to an unbroken one."""
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
        raise CheckpointError(f"{path}: world_size {saved!r} in trainer_state.pt is not a rank "
                              "count; the file is damaged or not from this trainer")
    if saved != dist_info.world_size:
        log.warning("%s was saved by %d rank(s) and is resumed on %d: model and optimizer are "
                    "resharded on load; losses will differ from an uninterrupted run in "
                    "the last digits (another summation order)", path, saved,
                    dist_info.world_size)


def _tied_names(model: torch.nn.Module) -> set[str]:
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()
