"""The trainer-at-scale GPU figures, run by bench/gpu/check.py after its own sections (same JSON).

    memory        one step with activation checkpointing off and on: peak GPU memory, step time,
                  and the loss (checkpointing recomputes, it must not change the step)
    shared        a Claude-Code-shaped step (rows sharing one long prompt, a short unique tail
                  each) with dense packing against the prefix-shared forward: tokens forwarded
                  and step time
    checkpoint    a sharded save (torch.distributed.checkpoint) of model + AdamW state, a resume
                  into a fresh trainer, and the next step's loss on both (must be equal)

Why here and not in check.py: check.py measures issue 16/17's numerics and weight stream; these
are issue 30's memory, prefix-sharing and checkpoint paths, each a function of (trainer
builder, device, rows) so the dry run (tiny shapes, CPU) runs the same code as the GPU.

Activation checkpointing and prefix sharing are switched by the trainer config's own fields
(`gradient_checkpointing`, `prefix_sharing`), so the GPU runs exactly what a training run runs.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PREFIX_SHARING_FIELD = "prefix_sharing"
ACTIVATION_CHECKPOINTING_FIELD = "gradient_checkpointing"

Builder = Callable[..., Any]  # (shape, device, dtype, lr, out, budget, **config) -> trainer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(trainer: Any, rows: list, adv: list[float]) -> tuple[dict, float, float | None]:
    """(metrics, seconds, peak GiB or None on CPU) of one run_step."""
    from trainer.loop import StepInput, run_step

    device = trainer.dist.device
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    _sync(device)
    t0 = time.perf_counter()
    metrics = run_step(trainer, StepInput(rows=rows, advantages=adv))
    _sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return metrics, seconds, peak


def checkpointing_memory(build: Builder, shape: str, device: torch.device, out: Path,
                         rows: list, adv: list[float], budget: int) -> dict:
    """One step from the same init with activation checkpointing off, then on."""
    result: dict[str, Any] = {"rows": len(rows), "tokens": sum(len(r) for r in rows)}
    for mode in ("off", "on"):
        extra = {ACTIVATION_CHECKPOINTING_FIELD: mode == "on"}
        trainer = build(shape, device, "bfloat16", 1e-6, out / f"ac-{mode}", budget, **extra)
        how = "trainer config, every decoder layer"
        run = _timed_step(trainer, rows, adv)  # warm-up: allocator, kernels
        metrics, seconds, peak = _timed_step(trainer, rows, adv)
        result[mode] = {"peak_memory_GiB": peak, "step_s": seconds, "loss": metrics["loss"],
                        "first_loss": run[0]["loss"], "how": how if mode == "on" else "none"}
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    off, on = result["off"], result["on"]
    result["loss_abs_diff"] = abs(off["first_loss"] - on["first_loss"])
    if off["peak_memory_GiB"] and on["peak_memory_GiB"]:
        result["memory_saved_frac"] = 1 - on["peak_memory_GiB"] / off["peak_memory_GiB"]
    result["recompute_time_ratio"] = on["step_s"] / max(off["step_s"], 1e-9)
    return result


def claude_code_rows(n_rows: int, prefix: int, suffix: int, vocab: int,
                     seed: int) -> tuple[list, list[float]]:
    """One shared prompt of `prefix` tokens, then `suffix` sampled tokens per row (trained)."""
    from trainer.rows import Row

    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(10, vocab, (prefix,), generator=gen).tolist()
    rows, adv = [], []
    for i in range(n_rows):
        tail = torch.randint(10, vocab, (suffix,), generator=gen).tolist()
        logps = (-torch.rand(suffix, generator=gen) * 4 - 0.5).tolist()
        rows.append(Row(input_ids=shared + tail, loss_mask=[0] * prefix + [1] * suffix,
                        behaviour_logprobs=[0.0] * prefix + logps,
                        version_start=[-1] * prefix + [0] * suffix,
                        version_end=[-1] * prefix + [0] * suffix, rollout_id=f"r{i}",
                        group_index=i // 8, node_ids=[f"n{i}"], n_sampled=suffix))
        adv.append(1.0 if i % 2 == 0 else -1.0)
    return rows, adv


def shared_vs_dense(build: Builder, shape: str, device: torch.device, out: Path, rows: list,
                    adv: list[float], budget: int) -> dict:
    """The same step dense and prefix-shared: tokens forwarded, step time, loss."""
    unique = len(rows[0]) + sum(len(r) - len(rows[0]) for r in rows)  # rows share all but tails
    result: dict[str, Any] = {"rows": len(rows), "row_tokens": sum(len(r) for r in rows),
                              "unique_tokens": unique}
    for shared in (False, True):
        extra = {PREFIX_SHARING_FIELD: shared}
        trainer = build(shape, device, "bfloat16", 1e-6, out / f"shared-{shared}", budget,
                        **extra)
        first = _timed_step(trainer, rows, adv)  # warm-up
        metrics, seconds, peak = _timed_step(trainer, rows, adv)
        result["shared" if shared else "dense"] = {
            "tokens_forwarded": metrics["tokens/forwarded"], "step_s": seconds,
            "peak_memory_GiB": peak, "first_loss": first[0]["loss"]}
        del trainer
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "shared" in result:
        d, s = result["dense"], result["shared"]
        result["speedup"] = d["step_s"] / max(s["step_s"], 1e-9)
        result["forwarded_over_unique"] = s["tokens_forwarded"] / unique
        result["loss_abs_diff"] = abs(d["first_loss"] - s["first_loss"])
    return result


def save_and_resume(build: Builder, shape: str, device: torch.device, out: Path, rows: list,
                    adv: list[float], budget: int) -> dict:
    """Step, save sharded, resume into a fresh trainer; both take the same next step."""
    from trainer.checkpoint import load_checkpoint

    root = out / "ckpt"
    shutil.rmtree(root, ignore_errors=True)
    trainer = build(shape, device, "bfloat16", 1e-6, root, budget)
    _timed_step(trainer, rows, adv)
    _sync(device)
    t0 = time.perf_counter()
    path = trainer.save()
    save_s = time.perf_counter() - t0
    on_disk = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    expected, _, _ = _timed_step(trainer, rows, adv)  # the uninterrupted run's next step
    del trainer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    fresh = build(shape, device, "bfloat16", 1e-6, root, budget)
    t0 = time.perf_counter()
    fresh.state = load_checkpoint(path, model=fresh.model, optimizer=fresh.optimizer,
                                  scheduler=fresh.scheduler, dist_info=fresh.dist)
    _sync(device)
    load_s = time.perf_counter() - t0
    got, _, _ = _timed_step(fresh, rows, adv)
    del fresh
    if device.type == "cuda":
        torch.cuda.empty_cache()
    shutil.rmtree(root, ignore_errors=True)  # a 4B checkpoint is ~64 GB: never keep it
    return {"save_s": save_s, "load_s": load_s, "bytes_on_disk": on_disk,
            "GBps_write": on_disk / max(save_s, 1e-9) / 1e9,
            "next_loss_uninterrupted": expected["loss"], "next_loss_resumed": got["loss"],
            "next_loss_abs_diff": abs(expected["loss"] - got["loss"])}


def run(section: Callable[[str, Callable[[], Any]], Any], build: Builder, device: torch.device,
        out: Path, *, dry_run: bool, vocab: int, make_rows: Callable[..., tuple[list, list]],
        deadline: float) -> None:
    """Every section of this module, each recorded through check.py's `section` (one JSON).

    `deadline` (time.monotonic()): a section that would start past it is recorded as skipped,
    so the whole check stays inside check.sh's 8 minutes."""
    shape = "tiny" if dry_run else "qwen3-0.6b"
    if dry_run:
        long_rows, n_cc, prefix, suffix, budget = (2, 64), 4, 48, 8, 128
    else:
        long_rows, n_cc, prefix, suffix, budget = (8, 4096), 32, 4096, 100, 8192
    rows, adv = make_rows(*long_rows, vocab, seed=2)
    cc_rows, cc_adv = claude_code_rows(n_cc, prefix, suffix, vocab, seed=3)
    plan = [
        (f"memory/{shape}", lambda: checkpointing_memory(build, shape, device, out, rows, adv,
                                                         budget)),
        (f"shared/{shape}", lambda: shared_vs_dense(build, shape, device, out, cc_rows, cc_adv,
                                                    budget)),
        (f"checkpoint/{shape}", lambda: save_and_resume(build, shape, device, out, rows, adv,
                                                        budget)),
    ]
    for name, fn in plan:
        if time.monotonic() > deadline:
            section(name, lambda: {"skipped": "check.sh's time budget was spent before this "
                                              "section; rerun it alone with more time"})
        else:
            section(name, fn)
