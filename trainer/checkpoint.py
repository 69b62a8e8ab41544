"""Checkpoints: everything needed to continue a run exactly where its data stood.

    <output_dir>/checkpoint-<step>/
        model/              HF layout (config + safetensors): servable by vLLM as is
        trainer_state.pt    optimizer, scheduler, RNG states, step, policy version,
                            next_group_index (the rollout position)
    <output_dir>/latest     name of the newest complete checkpoint

The rollout position is the point: groups are numbered, group g runs with seed g (on the task
its index, the seed and the epoch pick: trainer/producer.py), and the trainer consumes them in
order. A checkpoint after step s stores
the first group index not yet consumed; resuming dispatches from exactly there, so a killed run
and an uninterrupted one see the same tasks in the same steps. Groups that were in flight at the
kill are rerun, never skipped (their rollouts are lost: a rollout cannot be checkpointed
half-way through an agent's run).

A checkpoint is written to `<name>.tmp` and renamed when complete, then `latest` is rewritten:
a kill during a save leaves the previous checkpoint as latest. Under FSDP every rank enters the
gathers (collectives) and rank 0 writes.
"""

from __future__ import annotations

import logging
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint_prune import prune_checkpoints
from trainer.distributed import DistInfo, full_state_dict
from trainer.errors import CheckpointError

__all__ = ["TrainerState", "find_latest", "load_checkpoint", "save_checkpoint"]

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


def _optimizer_state(model, optimizer, dist_info: DistInfo) -> dict | None:
    if not dist_info.distributed:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    osd = get_optimizer_state_dict(model, optimizer,
                                   options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return osd if dist_info.is_main else None


def save_checkpoint(
    output_dir: str | Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    state: TrainerState,
    dist_info: DistInfo,
    tokenizer: Any = None,
    total_limit: int | None = None,
) -> Path:
    """Save a checkpoint (every rank calls this; rank 0 writes). Returns its directory."""
    root = Path(output_dir)
    name = f"checkpoint-{state.step}"
    final = root / name
    model_sd = full_state_dict(model, dist_info)
    optim_sd = _optimizer_state(model, optimizer, dist_info)
    if dist_info.is_main:
        tmp = root / f"{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / "model").mkdir(parents=True)
        model.save_pretrained(tmp / "model", state_dict=model_sd)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        torch.save({
            "state": asdict(state),
            "optimizer": optim_sd,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "rng": _rng_state(),
            "world_size": dist_info.world_size,
        }, tmp / "trainer_state.pt")
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        (root / "latest.tmp").write_text(name)
        (root / "latest.tmp").replace(root / "latest")
        if total_limit is not None:  # by write order, never the one just written
            prune_checkpoints(root, total_limit, keep=final)
    if dist_info.distributed:
        # On the control group: the others wait here while rank 0 writes (minutes for a large
        # model), longer than the step collectives' timeout allows.
        torch.distributed.barrier(group=dist_info.control_group)
    return final


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
) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG in place; return the trainer state."""
    path = Path(path)
    if not (path / "trainer_state.pt").exists() or not (path / "model").exists():
        raise CheckpointError(f"{path} is not a complete checkpoint (needs model/ and "
                              "trainer_state.pt); pass a checkpoint-<step> directory or "
                              "resume_from_checkpoint=True to use <output_dir>/latest")
    blob = torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=False)
    missing_fields = sorted({"state", "optimizer", "scheduler", "rng", "world_size"} - set(blob))
    if missing_fields:
        raise CheckpointError(f"{path}/trainer_state.pt lacks {missing_fields}: it was not "
                              "written by this trainer's save_checkpoint")
    from safetensors.torch import load_file

    files = sorted((path / "model").glob("*.safetensors"))
    model_sd: dict[str, torch.Tensor] = {}
    for f in files:
        model_sd.update(load_file(str(f)))
    # Keys: checked on every rank against the model's own (FSDP2 keeps the unwrapped names),
    # before anything is loaded, so a wrong checkpoint fails on all ranks alike.
    problem = _key_problem(path, set(model_sd), model)
    if problem:
        raise CheckpointError(problem)
    _check_world_size(path, blob["world_size"], dist_info)
    if not dist_info.distributed:
        model.load_state_dict(model_sd, strict=False)  # keys checked above (tied ones absent)
        optimizer.load_state_dict(blob["optimizer"])
    else:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        set_model_state_dict(model, model_sd if dist_info.is_main else {}, options=opts)
        set_optimizer_state_dict(model, optimizer,
                                 blob["optimizer"] if dist_info.is_main else {}, options=opts)
    if scheduler is not None and blob["scheduler"] is not None:
        scheduler.load_state_dict(blob["scheduler"])
    _set_rng_state(blob["rng"])
    return TrainerState(**blob["state"])


def _key_problem(path: Path, saved: set[str], model: torch.nn.Module) -> str | None:
    expected = set(model.state_dict())
    tied = _tied_names(model)
    missing = sorted(expected - saved - tied)
    unexpected = sorted(saved - expected)
    if not missing and not unexpected:
        return None
    return (f"{path}: model keys differ from this model's ({len(missing)} missing, e.g. "
            f"{missing[:5]}; {len(unexpected)} unexpected, e.g. {unexpected[:5]}); was it saved "
            "from another model? Resume with the model the run was started with.")


def _check_world_size(path: Path, saved: Any, dist_info: DistInfo) -> None:
    """Model and optimizer are saved whole (unsharded), so another world size can load them; the
    loss is then summed in another order, so the run is not bit-identical to an unbroken one."""
    if not isinstance(saved, int) or isinstance(saved, bool) or saved < 1:
        raise CheckpointError(f"{path}: world_size {saved!r} in trainer_state.pt is not a rank "
                              "count; the file is damaged or not from this trainer")
    if saved != dist_info.world_size:
        log.warning("%s was saved by %d rank(s) and is resumed on %d: model and optimizer are "
                    "whole-state and load as is; losses will differ from an uninterrupted run in "
                    "the last digits (another summation order)", path, saved,
                    dist_info.world_size)


def _tied_names(model: torch.nn.Module) -> set[str]:
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        return {"lm_head.weight"}
    return set()
