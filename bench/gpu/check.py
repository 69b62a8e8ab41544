"""GPU check: the trainer's bf16 step, its numerics and its weight stream, measured on one machine.

    bench/gpu/check.sh                       # on a GPU machine: <= 8 min on one H200
    python bench/gpu/check.py --dry-run      # tiny shapes, CPU, gloo: what tests/test_gpu_check.py runs

Why it exists: nothing of the GPU path can run on the CPU machines the project is built on, and a
lent GPU machine has torch and transformers but no vLLM, no project venv and no network, and
takes at most 64 MiB of files. So this check needs only this repo and that machine's own torch
and transformers, builds its models from configs (random init at the Qwen3-0.6B and Qwen3-4B
shapes; nothing is downloaded), and uses the project's own trainer for everything it measures:
`HarnessAsyncGRPOTrainer` (fp32 master weights, bf16 autocast), `trainer.loop.run_step` for the
step and `trainer.loop.push_weights` (`FullModelView`: one parameter at a time, cast to bf16 on
the device) for the weight stream. One JSON of figures comes out, written after every section so
that a timeout still leaves what was measured:

    env        torch/transformers/CUDA versions, device, bf16 peak FLOP/s used for MFU
    copy       device-to-device copy bandwidth (bytes copied per second), the yardstick below
    train      per shape: tokens/s of a bf16 train step (all row tokens, forward + backward +
               AdamW), MFU = 6 * params * tokens/s / peak (attention FLOPs not counted),
               peak memory
    moved      per shape: the share of weights one lr-1e-6 step changes: fp32 master weights,
               their bf16 cast (what the engine is sent), and (0.6B, tiny) an fp32-compute
               reference from the same init and rows, with the cosine between the two updates
    memory, shared, checkpoint   issue 30's sections: bench/gpu/sections.py
    transfer   the full bf16 weights of the largest shape streamed by push_weights into a second
               process: NCCL broadcast when two GPUs are visible (NCCL refuses two ranks on one
               GPU: "Duplicate GPU detected", NCCL >= 2.5), and a CUDA IPC staging buffer (what
               a colocated engine would use) always; GB/s, the ratio to `copy`, checksums
               compared on both sides

What it does not measure: vLLM (its receiving side, its NCCL engine), FSDP2 over several GPUs,
agents. Those need the HF Jobs run (launchers/hf_jobs.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.gpu.transfer import stream_only, sync_device, transfer  # noqa: E402

# Qwen3 config.json values (hub repos Qwen/Qwen3-0.6B and Qwen/Qwen3-4B); "tiny" is the dry run's.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128},
    "qwen3-4b": {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                 "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
             "vocab_size": 512},
}
COMMON = {"vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
          "rms_norm_eps": 1e-6, "max_position_embeddings": 40960}
# check.sh ends this process at 480 s; a section of sections.py starts only before this, so the
# JSON is written whole (the slowest, the sharded save of 0.6B, took well under a minute).
SECTIONS_START_BY_S = 390.0
# Dense bf16 peak FLOP/s by device name (vendor datasheets, without sparsity).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12}


# -- inputs ----------------------------------------------------------------------------------------

def make_rows(n_rows: int, seq_len: int, vocab: int, seed: int) -> tuple[list, list[float]]:
    """Agent-shaped rows: a prompt (context) then a completion (trained), advantages +-1."""
    from trainer.rows import Row

    gen = torch.Generator().manual_seed(seed)
    rows, advantages = [], []
    prompt = seq_len // 2
    for i in range(n_rows):
        ids = torch.randint(10, vocab, (seq_len,), generator=gen).tolist()
        mask = [0] * prompt + [1] * (seq_len - prompt)
        logps = [0.0] * prompt + (-torch.rand(seq_len - prompt, generator=gen) * 4 - 0.5).tolist()
        versions = [-1] * prompt + [0] * (seq_len - prompt)
        rows.append(Row(input_ids=ids, loss_mask=mask, behaviour_logprobs=logps,
                        version_start=versions, version_end=list(versions),
                        rollout_id=f"r{i}", group_index=i // 2, node_ids=[f"n{i}"],
                        n_sampled=seq_len - prompt))
        advantages.append(1.0 if i % 2 == 0 else -1.0)
    return rows, advantages


class _NoRollouts:
    """The trainer wants a rollout source; this check feeds run_step directly and never asks."""

    async def rollout(self, task: Any, seed: int, episode_id: str) -> Any:
        raise RuntimeError("the GPU check steps on fixed rows; no rollout is ever requested")


def build_trainer(shape: str, device: torch.device, dtype: str, lr: float, out: Path,
                  budget: int, **settings: Any) -> Any:
    """The project's trainer on a random-init model of `shape`; `settings`: more AsyncGRPOConfig
    fields (bench/gpu/sections.py switches checkpointing and prefix sharing with them)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trainer.config import AsyncGRPOConfig
    from trainer.grpo import HarnessAsyncGRPOTrainer

    config = Qwen3Config(**{**COMMON, **SHAPES[shape]})
    torch.manual_seed(0)
    with torch.device(device):  # random init where it will train: no host round trip
        model = Qwen3ForCausalLM(config)
    args = AsyncGRPOConfig(dtype=dtype, learning_rate=lr, num_generations=2, max_steps=10**6,
                           max_tokens_per_microbatch=budget, report_to="none",
                           output_dir=str(out / f"{shape}-{dtype}"), **settings)
    return HarnessAsyncGRPOTrainer(model, lambda sampling: _NoRollouts(), args)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


# -- sections --------------------------------------------------------------------------------------

def copy_bandwidth(device: torch.device, n_bytes: int, repeats: int = 10) -> dict:
    src = torch.empty(n_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync_device(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        dst.copy_(src)
    sync_device(device)
    seconds = time.perf_counter() - t0
    return {"bytes": n_bytes, "repeats": repeats,
            "GBps": n_bytes * repeats / seconds / 1e9,
            "note": "bytes copied per second (each byte is read once and written once)"}


def train_figures(trainer: Any, rows: list, adv: list[float], steps: int, peak: float | None) -> dict:
    from trainer.loop import StepInput, run_step

    device = trainer.dist.device
    n_params = sum(p.numel() for p in trainer.model.parameters())
    tokens = sum(len(r) for r in rows)
    run_step(trainer, StepInput(rows=rows, advantages=adv))  # warm-up: allocator, kernels
    sync_device(device)
    t0 = time.perf_counter()
    metrics = [run_step(trainer, StepInput(rows=rows, advantages=adv)) for _ in range(steps)]
    sync_device(device)
    seconds = (time.perf_counter() - t0) / steps
    tps = tokens / seconds
    return {"params": n_params, "tokens_per_step": tokens, "rows": len(rows), "steps": steps,
            "step_s": seconds, "tokens_per_s": tps,
            "mfu": 6 * n_params * tps / peak if peak else None,
            "compute_dtype": str(trainer.compute_dtype).replace("torch.", ""),
            "param_dtype": str(next(trainer.model.parameters()).dtype).replace("torch.", ""),
            "loss_finite": all(math.isfinite(m["loss"]) for m in metrics),
            "nonfinite_skipped": sum(m["steps/nonfinite_skipped"] for m in metrics),
            "peak_memory_GiB": _peak_gib(device)}


def _snapshot(model: torch.nn.Module, host: bool) -> list[torch.Tensor]:
    return [p.detach().to("cpu", copy=True) if host else p.detach().clone()
            for p in model.parameters()]


def moved_fraction(trainer: Any, rows: list, adv: list[float], reference: Any | None,
                   host: bool = False) -> dict:
    """One lr step from the same weights: the share of elements that change, and vs fp32.

    `host`: keep the before/after copies in host memory (at 4B two fp32 copies on the GPU next
    to the trainer's 64 GB would crowd one H200)."""
    from trainer.loop import StepInput, run_step

    def step(t: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        before = _snapshot(t.model, host)
        run_step(t, StepInput(rows=rows, advantages=adv))
        return before, _snapshot(t.model, host)

    def frac(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        changed = sum(int((a != b).sum()) for a, b in pairs)
        return changed / sum(a.numel() for a, _ in pairs)

    before, after = step(trainer)
    out = {"lr": trainer.args.learning_rate,
           "master_moved_frac": frac(list(zip(before, after, strict=True))),
           "served_bf16_moved_frac": frac([(a.bfloat16(), b.bfloat16())
                                           for a, b in zip(before, after, strict=True)])}
    if reference is not None:
        ref_before, ref_after = step(reference)
        same_init = all(torch.equal(a, b) for a, b in zip(before, ref_before, strict=True))
        num = sum(float(((a1 - a0).double() * (b1 - b0).double()).sum())
                  for a0, a1, b0, b1 in zip(before, after, ref_before, ref_after, strict=True))
        na = math.sqrt(sum(float(((a1 - a0).double() ** 2).sum())
                           for a0, a1 in zip(before, after, strict=True)))
        nb = math.sqrt(sum(float(((b1 - b0).double() ** 2).sum())
                           for b0, b1 in zip(ref_before, ref_after, strict=True)))
        out.update({"reference": "fp32 compute, fp32 weights, same init and rows",
                    "reference_same_init": same_init,
                    "reference_moved_frac": frac(list(zip(ref_before, ref_after, strict=True))),
                    "update_cosine_vs_reference": num / (na * nb) if na and nb else None})
    return out


# -- the run ---------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu/check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "bench" / "gpu" / "gpu_check.json"))
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (gloo)")
    parser.add_argument("--steps", type=int, default=3, help="timed train steps per shape")
    args = parser.parse_args(argv)
    out_path = Path(args.out)
    started = time.monotonic()
    report: dict[str, Any] = {"dry_run": args.dry_run, "started": time.strftime("%FT%TZ", time.gmtime())}

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=1))

    def section(name: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            report[name] = fn()
        except Exception as exc:  # record and go on: the other sections still measure
            report[name] = {"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-3000:]}
        report[name + "_s"] = round(time.perf_counter() - t0, 2)
        save()
        print(f"[gpu-check] {name}: {json.dumps(report[name])[:400]}", flush=True)
        return report[name]

    import transformers

    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    name = torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu"
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None) if cuda else None
    gpus = torch.cuda.device_count() if cuda else 0
    report["env"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                     "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version()))
                     if cuda else None, "device": name, "gpus": gpus, "peak_bf16_flops": peak,
                     "python": platform.python_version()}
    save()

    shapes = ["tiny"] if args.dry_run else ["qwen3-0.6b", "qwen3-4b"]
    n_rows, seq_len, budget = (4, 64, 128) if args.dry_run else (8, 2048, 4096)
    copy = section("copy", lambda: copy_bandwidth(device, (8 if args.dry_run else 2048) * 2**20))
    copy_gbps = copy.get("GBps")
    tmp = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    vocab = SHAPES["tiny"]["vocab_size"] if args.dry_run else COMMON["vocab_size"]
    rows, adv = make_rows(n_rows, seq_len, vocab, seed=1)
    for i, shape in enumerate(shapes):
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        trainer = build_trainer(shape, device, "bfloat16", 1e-6, tmp, budget)
        section(f"train/{shape}", lambda t=trainer: train_figures(t, rows, adv, args.steps, peak))
        last = i == len(shapes) - 1
        # An fp32 reference (and a fresh bf16 trainer from the same init) triples the memory:
        # affordable at 0.6B and tiny, not at 4B (3 x 64 GB of weights, grads and AdamW state),
        # where the step is taken from the trained weights, without a reference.
        reference = fresh = None
        if not last or args.dry_run:
            reference = build_trainer(shape, device, "float32", 1e-6, tmp, budget)
            fresh = build_trainer(shape, device, "bfloat16", 1e-6, tmp, budget)
        section(f"moved/{shape}", lambda f=fresh or trainer, r=reference, h=last and cuda:
                moved_fraction(f, rows, adv, r, host=h))
        del reference, fresh
        if last:
            section(f"stream/{shape}", lambda t=trainer: stream_only(t))
            kinds = ["gloo", "ipc"] if args.dry_run else ["ipc"] + (["nccl"] if gpus >= 2 else [])
            for kind in kinds:
                peer = "cpu" if not cuda else ("cuda:1" if kind == "nccl" else "cuda:0")
                section(f"transfer/{kind}/{shape}",
                        lambda t=trainer, k=kind, p=peer: transfer(t, k, p, copy_gbps))
            if cuda and gpus < 2:
                report[f"transfer/nccl/{shape}"] = {
                    "skipped": "one GPU visible: NCCL refuses two ranks on one device "
                               "(ncclInvalidUsage 'Duplicate GPU detected', NCCL >= 2.5); run on "
                               "a machine with 2 GPUs for the NCCL figure"}
        del trainer
        if cuda:
            torch.cuda.empty_cache()
    # Issue 30: memory with activation checkpointing off/on, dense against prefix-shared step
    # time, sharded save and resume (bench/gpu/sections.py), inside check.sh's 8 minutes.
    from bench.gpu.sections import run as issue30_sections

    issue30_sections(section, build_trainer, device, tmp, dry_run=args.dry_run, vocab=vocab,
                     make_rows=make_rows, deadline=started + SECTIONS_START_BY_S)
    # The layout (issue 17): the trainer side runs without the rollout side's packages, as in
    # .trainer-venv, where they are not installed at all.
    report["env"]["rollout_side_modules"] = sorted(
        {m.split(".")[0] for m in sys.modules} & {"openenv", "harbor", "capture"})
    report["finished"] = time.strftime("%FT%TZ", time.gmtime())
    save()
    print(f"[gpu-check] wrote {out_path}", flush=True)
    errors = [k for k, v in report.items() if isinstance(v, dict) and "error" in v]
    return 1 if errors else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
