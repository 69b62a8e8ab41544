"""How much GPU memory one trainer rank needs: a calculator, and the README's table.

    python -m trainer.memory --table                 # Qwen3-4B/8B/32B on 8x H100 / 8x H200
    python -m trainer.memory --table --tokens 16384 --logits-chunk 2048
    python -m trainer.memory --table --reference     # with beta > 0's frozen reference model
    python -m trainer.memory --table --optimizer sgd # plain SGD: no optimizer state

Why it exists: the first real run should not be the way to learn that a model does not fit.
Every term below is what this trainer allocates (trainer/grpo.py, distributed.py, forward.py,
loss.py), per GPU, with FSDP2 over `world` GPUs and a bf16 compute dtype:

- parameters: fp32 master weights, sharded (4 P / world bytes);
- gradients: fp32, sharded after the reduce-scatter (4 P / world);
- AdamW state: exp_avg and exp_avg_sq, fp32, sharded (8 P / world); none with `--optimizer sgd`
  (plain SGD, no momentum, keeps no state: trainer/config.py `optimizer`);
- gathered: the bf16 copies FSDP2 all-gathers: the current and the prefetched decoder layer,
  and the root unit (embeddings, final norm, lm_head), which stays gathered through the step;
  plus one layer's unsharded gradient in bf16 and in fp32 for the reduce (MixedPrecisionPolicy
  reduce_dtype=float32);
- activations: what autograd saves for backward, counted op by op for a Qwen3 decoder layer
  (`layer_activation_bytes`): RMSNorm keeps an fp32 copy of its input and its bf16 output,
  sdpa/flash attention keeps q, k, v, its output and a logsumexp, the MLP keeps gate, up,
  SiLU(gate) and their product. With checkpointing only each layer's input is kept, and one
  layer is recomputed (its activations live again) during its backward;
- backward working set: the largest transient gradients of one layer's backward (two
  [tokens x intermediate] MLP gradients and the residual stream's);
- logits: one [chunk x vocabulary] slab of fp32 logits and its softmax (loss.py), plus the
  [tokens x hidden] final hidden states kept for the chunked backward and their gradient.

- reference (`beta > 0`, `--reference`): the frozen initial policy in bf16, sharded like the
  policy (2 P / world), and its current and prefetched layer and root unit gathered during its
  forward. That forward runs under no_grad before the policy's, so it adds no activations to the
  policy's peak (trainer/loop.py).

- deferred gradients: with `reduce_grads_per_microbatch="auto"` FSDP2 holds every unit's
  unsharded bf16 gradient until the step's last micro-batch where those (2 P bytes) fit in a
  quarter of the GPU (trainer/loop.py defer_grad_sync); the table adds them per GPU type.

The peak (`total`) is the persistent state, the gathered weights, what the forward kept, and the
larger of two phases that do not overlap: the logits' backward, and one layer's backward (with
its recomputed activations under checkpointing).

How it was checked (tests/test_trainer_memory.py): on the CPU, the bytes autograd saves in a
small Qwen3's forward (counted by saved-tensor hooks) against `layer_activation_bytes`, fp32 and
bf16; the peak resident memory of a whole forward and backward, with checkpointing on and off,
against `estimate`; and (tests/test_trainer_sharded_load.py) each of two ranks' peak during the
sharded load against its share of `ModelShape.params()`.

Not counted: the CUDA context and NCCL buffers (~1-3 GiB), allocator fragmentation, and attention
kernels that save more than
flash attention does (sdpa's math path keeps a [heads x tokens x tokens] matrix). A row longer
than `max_tokens_per_microbatch` is forwarded alone, whole: its activations are those of a
micro-batch of its length, so size the budget (`--tokens`) for the longest row you train.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

__all__ = ["GPUS", "QWEN3", "ModelShape", "estimate", "fixed_activation_bytes", "layer_activation_bytes",
           "table"]

GiB = 2**30
FP32 = 4
# fp32 tensors of optimizer state per parameter (trainer/grpo.py builds one or the other).
OPTIMIZER_STATES = {"adamw": 2, "sgd": 0}
DEFERRED_GRAD_SHARE = 0.25  # trainer/loop.py's; not imported: this module must stay torch-free


@dataclass(frozen=True)
class ModelShape:
    """The shapes that decide memory, for a Qwen3/Llama-style decoder (GQA, SwiGLU MLP)."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qk_norm: bool = True  # Qwen3 normalises q and k per head

    @classmethod
    def from_config(cls, cfg: Any) -> ModelShape:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return cls(vocab=cfg.vocab_size, hidden=cfg.hidden_size,
                   intermediate=cfg.intermediate_size, layers=cfg.num_hidden_layers,
                   heads=cfg.num_attention_heads,
                   kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                   head_dim=head_dim, tied=bool(getattr(cfg, "tie_word_embeddings", False)),
                   qk_norm=getattr(cfg, "model_type", "qwen3").startswith("qwen3"))

    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * h * self.intermediate + 2 * h  # + input and post-attention norms

    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden  # + final norm

    def params(self) -> int:
        return self.layers * self.layer_params() + self.root_params()


# Shapes from each model's config.json on the Hugging Face Hub (Qwen/Qwen3-4B, -8B, -32B).
QWEN3 = {
    "Qwen3-4B": ModelShape(151936, 2560, 9728, 36, 32, 8, 128, tied=True),
    "Qwen3-8B": ModelShape(151936, 4096, 12288, 36, 32, 8, 128, tied=False),
    "Qwen3-32B": ModelShape(151936, 5120, 25600, 64, 64, 8, 128, tied=False),
}
# name -> memory in GiB as CUDA reports it (nvidia-smi: 81559 MiB and 143771 MiB)
GPUS = {"H100 80GB": 81559 / 1024, "H200 141GB": 143771 / 1024}


def _norm(width: int, b: int) -> int:
    """Bytes an RMSNorm saves per token: its input upcast to fp32 and its output in b bytes.

    (In fp32 the upcast is the input itself: 4 + 4 bytes, the same formula.)"""
    return (FP32 + b) * width


def layer_activation_bytes(s: ModelShape, b: int = 2) -> int:
    """Bytes autograd saves per token in one decoder layer's forward (compute dtype b bytes)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    saved = 2 * _norm(s.hidden, b)  # input and post-attention RMSNorm
    if s.qk_norm:
        saved += _norm(q, b) + _norm(kv, b)  # per-head q and k norms
    saved += b * (q + kv)  # rotate_half(q), rotate_half(k), kept for the * sin
    saved += b * (2 * q + 2 * kv) + FP32 * s.heads  # attention: q, k, v, output; logsumexp
    saved += b * q  # o_proj's input (the output made contiguous)
    saved += b * 4 * s.intermediate  # gate, up, SiLU(gate), SiLU(gate) * up
    return saved


def fixed_activation_bytes(s: ModelShape, b: int = 2) -> int:
    """Bytes saved per token outside the layers: the final norm and rotary cos/sin."""
    return _norm(s.hidden, b) + 2 * b * s.head_dim


def estimate(s: ModelShape, *, world: int, tokens: int, checkpointing: bool, b: int = 2,
             logits_chunk: int = 1024, reference: bool = False,
             optimizer: str = "adamw") -> dict[str, float]:
    """Bytes per GPU, by term, for one micro-batch of `tokens` tokens (see the module doc)."""
    p, pl, pr = s.params(), s.layer_params(), s.root_params()
    out: dict[str, float] = {
        "parameters": FP32 * p / world,
        "gradients": FP32 * p / world,
        "optimizer": OPTIMIZER_STATES[optimizer] * FP32 * p / world,
        "gathered": b * (2 * pl + pr) + (b + FP32) * max(pl, pr),
    }
    a_layer, a_fixed = layer_activation_bytes(s, b), fixed_activation_bytes(s, b)
    kept_per_layer = b * s.hidden if checkpointing else a_layer  # what the forward leaves
    kept = tokens * (s.layers * kept_per_layer + a_fixed)
    recomputed = tokens * a_layer if checkpointing else 0  # one layer, again, in its backward
    out["activations"] = kept + recomputed
    out["backward"] = tokens * b * (2 * s.intermediate + s.hidden)
    chunk = min(logits_chunk, tokens) if logits_chunk > 0 else tokens
    out["logits"] = chunk * s.vocab * (2 * FP32 + b) + tokens * 2 * b * s.hidden
    if reference:  # bf16 frozen copy, sharded, gathered a layer at a time
        out["reference"] = b * p / world + b * (2 * pl + pr)
    # The logits phase (start of backward) and one layer's backward do not overlap: the peak
    # is what the forward kept plus the larger of the two.
    transient = max(out["logits"], recomputed + out["backward"])
    out["total"] = sum(v for k, v in out.items()
                       if k not in ("activations", "backward", "logits")) + kept + transient
    return out


def deferred_grad_bytes(s: ModelShape, gpu_gib: float, b: int = 2) -> float:
    """Unsharded gradients "auto" holds to the last micro-batch on this GPU (0: it doesn't)."""
    held = b * s.params()
    return held if held <= DEFERRED_GRAD_SHARE * gpu_gib * GiB else 0.0


def table(tokens: int = 32768, world: int = 8, logits_chunk: int = 1024,
          reference: bool = False, optimizer: str = "adamw") -> str:
    """The README's markdown table: GiB per GPU, checkpointing on / off (`reference`: beta > 0)."""
    gpus = " / ".join(GPUS)
    opt = {"adamw": "AdamW", "sgd": "SGD (no state)"}[optimizer]
    lines = [f"| model | params (B) | parameters + grads + {opt} (GiB) | gathered bf16 | "
             f"activations at {tokens // 1024}k tokens, ckpt on / off | logits / layer backward | "
             f"total on / off{' (with the reference)' if reference else ''} | deferred grads ({gpus}) | 8x H100 80GB | 8x H200 141GB |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in QWEN3.items():
        on = estimate(s, world=world, tokens=tokens, checkpointing=True, logits_chunk=logits_chunk,
                      reference=reference, optimizer=optimizer)
        off = estimate(s, world=world, tokens=tokens, checkpointing=False,
                       logits_chunk=logits_chunk, reference=reference, optimizer=optimizer)
        state = on["parameters"] + on["gradients"] + on["optimizer"]
        fits, deferred = [], []
        for cap in GPUS.values():
            usable = cap - 3  # CUDA context, NCCL buffers, fragmentation
            held = deferred_grad_bytes(s, cap)
            deferred.append(f"{held / GiB:.1f}")
            fits.append(" / ".join("fits" if (e["total"] + held) / GiB <= usable else "no"
                                   for e in (on, off)))
        lines.append(
            f"| {name} | {s.params() / 1e9:.2f} | {state / GiB:.1f} | {on['gathered'] / GiB:.1f} "
            f"| {on['activations'] / GiB:.1f} / {off['activations'] / GiB:.1f} "
            f"| {on['logits'] / GiB:.1f} / {on['backward'] / GiB:.1f} "
            f"| {on['total'] / GiB:.1f} / {off['total'] / GiB:.1f} | {' / '.join(deferred)} "
            f"| {fits[0]} | {fits[1]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.memory", description=__doc__.split(
        "\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="store_true",
                    help="print the README table for Qwen3-4B/8B/32B (the default action)")
    ap.add_argument("--tokens", type=int, default=32768,
                    help="tokens per GPU in one micro-batch (default 32768)")
    ap.add_argument("--world", type=int, default=8, help="GPUs the model is sharded over")
    ap.add_argument("--reference", action="store_true",
                    help="count the beta > 0 reference model (bf16, sharded) in every total")
    ap.add_argument("--optimizer", choices=sorted(OPTIMIZER_STATES), default="adamw",
                    help="the trainer's optimizer: adamw keeps two fp32 moments, sgd none")
    ap.add_argument("--logits-chunk", type=int, default=1024,
                    help="logits_chunk_tokens (0: dense logits of every token)")
    a = ap.parse_args(argv)
    for name, value in (("--tokens", a.tokens), ("--world", a.world)):
        if value < 1:
            ap.error(f"{name}={value}: must be >= 1")
    if a.logits_chunk < 0:
        ap.error(f"--logits-chunk={a.logits_chunk}: must be >= 0")
    print(table(a.tokens, a.world, a.logits_chunk, a.reference, a.optimizer))
    print(f"\nGiB per GPU, FSDP2 over {a.world} GPUs, bf16 compute on fp32 master weights. "
          "Activations include the recomputed layer when checkpointing; the total adds the larger "
          "of the logits and layer-backward phases (they do not overlap); 'fits' leaves 3 GiB for "
          "the CUDA context and NCCL and adds the deferred gradients (0.0: that GPU reduces after "
          "every micro-batch)" + (", and the beta > 0 reference model" if a.reference else "")
          + ". See trainer/memory.py.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
