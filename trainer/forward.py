"""One packed forward: the policy's logprobs (and entropy) for a micro-batch's targets.

Shared by the training step and by the tests that compare the trainer's logprobs with the
engine's, so both measure the very same computation.
"""

from __future__ import annotations

import torch

from trainer.loss import token_logprobs
from trainer.packing import MicroBatch, pack_rows
from trainer.rows import Row
from trainer.tree_attention import tree_forward_kwargs

__all__ = ["microbatch_logprobs", "row_logprobs"]


def microbatch_logprobs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float, *, with_entropy: bool = True,
    autocast: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp [K] (with grad when grad is enabled) and entropy [K] | None for mb's targets.

    `autocast`: run the model's forward (not the log-softmax) under autocast to that dtype,
    how one process computes in bf16 on fp32 master weights (trainer/grpo.py)."""
    device_type = mb.input_ids.device.type
    with torch.autocast(device_type, dtype=autocast or torch.float32, enabled=autocast is not None):
        out = model(
            input_ids=mb.input_ids,  # [1, N]
            position_ids=mb.position_ids,  # [1, N]  restarts per row -> block-causal attention
            use_cache=False,  # a cache would disable HF's packed-sequence detection
            logits_to_keep=mb.logit_index,  # [K]  only positions that predict a target
            **tree_forward_kwargs(model, mb.tree),  # prefix sharing (issue 30): {} when dense
        )
    logits = out.logits[0]  # [K, V]  token_logprobs upcasts to fp32
    return token_logprobs(logits, mb.target_ids, temperature, with_entropy=with_entropy)


@torch.no_grad()
def row_logprobs(
    model: torch.nn.Module, rows: list[Row], temperature: float, *, budget: int = 8192
) -> list[list[float]]:
    """Per row, the model's logprob of each trainable token, in row order (for checks)."""
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for row in rows:
        mbs, _ = pack_rows([row], [row.loss_mask], [0.0], budget=max(budget, len(row)))
        if not mbs:
            out.append([])
            continue
        logp, _ = microbatch_logprobs(model, mbs[0].to(device), temperature, with_entropy=False)
        out.append(logp.float().cpu().tolist())
    return out
