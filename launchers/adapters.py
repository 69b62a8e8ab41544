"""LoRA adapter folders as models: recognise one, and merge it into its base as an HF model.

Why here, in launchers/: an adapter folder (a LoRA run's <output-dir>/trainer/model, or one of its
pushed versions under trainer/adapters/v<N>) is something a process is started with. `harness.eval
--model ADAPTER` merges it into its base once, in the run folder, and the engine serves the merged
model like any other: exact (the merge is W + scale * B @ A, the same sum the adapter computes),
and no LoRA flags on the engine. `python -m trainer.lora ADAPTER OUT` is the same merge by hand.

An adapter folder is peft's layout: adapter_config.json (rank, alpha, target modules, and
`base_model_name_or_path`, the base it was trained on) + adapter_model.safetensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

__all__ = ["ADAPTER_CONFIG", "adapter_base", "is_adapter_dir", "merge_adapter_dir"]

ADAPTER_CONFIG = "adapter_config.json"  # what marks a folder as a peft adapter


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str:
    """The base model an adapter folder names (`base_model_name_or_path`)."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{path}/{ADAPTER_CONFIG} names no base_model_name_or_path: pass the "
                         "base model explicitly")
    return str(base)


def merge_adapter_dir(adapter: str | Path, output: str | Path, base: str | Path | None = None,
                      dtype: str = "float32") -> Path:
    """Fold an adapter folder into its base and write an HF model (config, safetensors,
    tokenizer) to `output`: what `vllm serve` and `from_pretrained` load with no peft at all.

    `base`: the base model (default: the adapter's `base_model_name_or_path`); `dtype`: the
    torch dtype name the merge is computed and written in."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = str(base) if base is not None else adapter_base(adapter)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=getattr(torch, dtype))
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    out = Path(output)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    merged.save_pretrained(str(tmp))
    tokenizer_from = adapter if (Path(adapter) / "tokenizer_config.json").is_file() else base
    AutoTokenizer.from_pretrained(str(tokenizer_from)).save_pretrained(str(tmp))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


