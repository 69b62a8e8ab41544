"""LoRA: train peft adapters on a frozen base, and hand the engine the adapters alone.

    args = AsyncGRPOConfig(lora_rank=16)          # alpha 32, every linear projection
    model = build_lora_model("models/tiny-qwen3", dist_info, compute_dtype, args)

Why a room of its own: with LoRA the numerics rule of trainer/grpo.py changes. Full fine-tuning
keeps fp32 master weights and AdamW state for every parameter (~16 bytes each). Here the base
never steps, so it is loaded in the compute dtype (bf16 on CUDA: 2 bytes a parameter, no master
copy, no optimizer state) and frozen; the adapters (lora_A, lora_B) stay fp32, as peft makes them,
and are the only parameters the optimizer holds.

FSDP2: the peft model is sharded like the plain one (each decoder layer, then the root). FSDP2
allows frozen and trainable parameters of different dtypes in one unit as long as the trainable
ones share one dtype (torch's _fsdp_param_group: the uniformity check is over trainable parameters
only), and `shard_model` takes the compute dtype from the adapters, so they are gathered and run
in bf16 and reduced in fp32 while the frozen base is gathered as it is.

Names: peft keeps the base's module names under `base_model.model.` and moves each wrapped
layer's weight to `.base_layer.`; an adapter file (`save_adapter`) is what `PeftModel.save_pretrained`
writes: adapter_config.json + adapter_model.safetensors, the names without the adapter name
("default"), which is the layout vLLM's `/v1/load_lora_adapter` and `PeftModel.from_pretrained`
both read. `launchers.adapters.merge_adapter_dir` folds an adapter folder into an HF model
(`python -m trainer.lora ADAPTER OUT`, and harness.eval/train given an adapter as --model).

Not covered: the meta-device sharded load of issue 30 (trainer/model_init.py). Under torchrun each
rank loads the base whole in the compute dtype on its CPU before sharding; that is 2 bytes a
parameter of host memory per rank, not the 4 of a full-fine-tuning load, but not one shard either.
A KL reference (beta > 0) is refused by the config for now; it would be the base with the
adapters off (`disable_adapter()`), no second copy.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from launchers.adapters import ADAPTER_CONFIG, is_adapter_dir, merge_adapter_dir
from trainer.distributed import DistInfo, shard_model

__all__ = [
    "ADAPTER_CONFIG",
    "adapter_names",
    "build_lora_model",
    "is_adapter_dir",
    "lora_config",
    "merge_adapter_dir",
    "save_adapter",
    "trainable_summary",
]

log = logging.getLogger(__name__)


def lora_config(args: Any) -> Any:
    """peft's LoraConfig from an AsyncGRPOConfig (lora_rank > 0)."""
    from peft import LoraConfig

    return LoraConfig(r=args.lora_rank, lora_alpha=args.lora_scale_alpha,
                      lora_dropout=float(args.lora_dropout),
                      target_modules=list(args.lora_target_modules), bias="none",
                      task_type="CAUSAL_LM")


def build_lora_model(model: str | Path | torch.nn.Module, dist_info: DistInfo,
                     compute_dtype: torch.dtype, args: Any) -> torch.nn.Module:
    """The base frozen in `compute_dtype`, fp32 adapters on it; sharded under torchrun."""
    from peft import get_peft_model

    if isinstance(model, torch.nn.Module):
        base = model.to(compute_dtype)
    else:
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(str(model), dtype=compute_dtype)
    base.requires_grad_(False)
    # autocast_adapter_dtype=True (peft's default): adapters are fp32 whatever the base's dtype,
    # so every update lands on fp32 weights, the master-weight rule of the full path.
    peft_model = get_peft_model(base, lora_config(args), autocast_adapter_dtype=True)
    missing = [m for m in args.lora_target_modules
               if not any(n.endswith(f".{m}") for n, _ in base.named_modules())]
    if missing:
        log.warning("lora_target_modules %s match no module of %s: no adapter there", missing,
                    type(base).__name__)
    peft_model.to(dist_info.device)
    if dist_info.distributed:
        shard_model(peft_model, compute_dtype)
    return peft_model


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The trainable (adapter) parameter names, in `named_parameters()` order."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def trainable_summary(model: torch.nn.Module) -> dict[str, int]:
    """Parameter counts and bytes, trainable vs frozen (the start-up log and the memory note)."""
    out = {"trainable_params": 0, "frozen_params": 0, "trainable_bytes": 0, "frozen_bytes": 0}
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        kind = "trainable" if p.requires_grad else "frozen"
        out[f"{kind}_params"] += p.numel()
        out[f"{kind}_bytes"] += local.numel() * local.element_size()
    return out


def _peft_model(model: Any) -> Any:
    """The PeftModel behind a model or a FullModelView of one."""
    inner = getattr(model, "model", None)
    if hasattr(model, "peft_config"):
        return model
    if inner is not None and hasattr(inner, "peft_config"):
        return inner
    raise TypeError(f"{type(model).__name__} is not a peft model (nor a view of one): LoRA "
                    "pushes and exports need the model build_lora_model made")


def save_adapter(model: Any, tensors: dict[str, torch.Tensor], directory: str | Path) -> Path:
    """Write `tensors` (full adapter parameters under the model's own names) as a peft adapter
    folder: adapter_config.json + adapter_model.safetensors. Written to <dir>.tmp and renamed, so a
    reader (the engine) never sees half a folder. Returns the folder."""
    peft_model = _peft_model(model)
    target = Path(directory)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    # state_dict=: peft keeps the lora_ keys, drops the adapter name, and writes safetensors
    peft_model.save_pretrained(str(tmp), state_dict=tensors)
    (tmp / "README.md").unlink(missing_ok=True)  # peft's model card: not ours to ship per push
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.lora ADAPTER_DIR OUTPUT_DIR [--base BASE]`: merge for serving."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m trainer.lora",
        description="Merge a LoRA adapter folder (a run's <output-dir>/trainer/model, or "
                    "adapters/v<N>) into its base model and write an HF model folder.")
    parser.add_argument("adapter", help="folder with adapter_config.json")
    parser.add_argument("output", help="where the merged HF model is written")
    parser.add_argument("--base", default=None,
                        help="base model (default: the adapter's base_model_name_or_path)")
    args = parser.parse_args(argv)
    if not is_adapter_dir(args.adapter):
        parser.error(f"{args.adapter} has no {ADAPTER_CONFIG}: not a LoRA adapter folder")
    print(merge_adapter_dir(args.adapter, args.output, args.base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
