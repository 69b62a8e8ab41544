"""One packed forward: the policy's logprobs (and entropy) for a micro-batch's targets.

Shared by the training step and by the tests that compare the trainer's logprobs with the
engine's, so both measure the very same computation.

Memory: the model is asked for its final hidden states (the decoder, not the
causal-LM head), and the head is applied in chunks of `logits_chunk` tokens by
`loss.chunked_token_logprobs`, so no [tokens x vocabulary] fp32 tensor of the whole micro-batch
exists (at a 152k vocabulary the dense path held ~4 of them, 6 GB each at 10k tokens).
Under FSDP2 that forward is registered as a forward method of the root unit
(`register_fsdp_forward_method`), so the root's parameters (embeddings, final norm, lm_head) are
gathered around it and its gradients reduced, exactly as around `model.forward`.
`logits_chunk=0` keeps the dense path (the model's own forward and `token_logprobs`).
"""

from __future__ import annotations

import torch

from trainer.loss import chunked_token_logprobs, token_logprobs
from trainer.packing import MicroBatch, pack_rows
from trainer.rows import Row
from trainer.tree_attention import tree_forward_kwargs

__all__ = ["DEFAULT_LOGITS_CHUNK", "lm_head_of", "microbatch_logprobs", "row_logprobs"]

DEFAULT_LOGITS_CHUNK = 1024  # tokens per [chunk x vocabulary] fp32 slab (0.6 GB at 152k vocab)
_METHOD = "harness_chunked_logprobs"  # the forward method registered with FSDP2


def lm_head_of(model: torch.nn.Module) -> torch.nn.Module:
    """The output projection (hidden -> vocabulary) of a transformers causal LM."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear):
        raise TypeError(f"{type(model).__name__} has no Linear output embedding (lm_head); "
                        "use logits_chunk=0 for the model's own forward")
    return head


def _decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is None or decoder is model:
        raise TypeError(f"{type(model).__name__} has no separate decoder (get_decoder()); use "
                        "logits_chunk=0 for the model's own forward")
    return decoder


def _chunked_forward(model: torch.nn.Module, input_ids: torch.Tensor, position_ids: torch.Tensor,
                     logit_index: torch.Tensor, targets: torch.Tensor, temperature: float,
                     chunk: int, with_entropy: bool,
                     tree: object | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = _decoder_of(model)(
        input_ids=input_ids,  # [1, N]
        position_ids=position_ids,  # [1, N]  restarts per row -> block-causal attention
        use_cache=False,  # a cache would disable HF's packed-sequence detection
        **tree_forward_kwargs(model, tree),  # prefix sharing: {} when dense
    )
    hidden = out.last_hidden_state[0, logit_index]  # [K, H]  after the final norm
    return chunked_token_logprobs(hidden, lm_head_of(model), targets, temperature, chunk=chunk,
                                  with_entropy=with_entropy)


def _chunked_method(model: torch.nn.Module):  # noqa: ANN202
    """`model.harness_chunked_logprobs`, created once; under FSDP2 registered as a forward."""
    method = model.__dict__.get(_METHOD)
    # A deepcopy of the model (the reference model) copies this attribute but not the function
    # it holds, which would still run the ORIGINAL model: check whose it is.
    if method is None or getattr(method, "harness_owner", None) is not model:
        from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

        def method(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            return _chunked_forward(model, *args, **kwargs)

        method.harness_owner = model  # functools.wraps carries it onto FSDP2's wrapper
        object.__setattr__(model, _METHOD, method)
        if isinstance(model, FSDPModule):
            register_fsdp_forward_method(model, _METHOD)  # root gather/reduce around it
        method = model.__dict__[_METHOD]
    return method


def microbatch_logprobs(
    model: torch.nn.Module, mb: MicroBatch, temperature: float, *, with_entropy: bool = True,
    autocast: torch.dtype | None = None, logits_chunk: int = DEFAULT_LOGITS_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp [K] (with grad when grad is enabled) and entropy [K] | None for mb's targets.

    `autocast`: run the model's forward (not the log-softmax) under autocast to that dtype,
    how one process computes in bf16 on fp32 master weights (trainer/grpo.py).
    `logits_chunk`: tokens whose logits exist at once (0: the dense [K, V] path)."""
    device_type = mb.input_ids.device.type
    with torch.autocast(device_type, dtype=autocast or torch.float32, enabled=autocast is not None):
        if logits_chunk > 0:
            return _chunked_method(model)(mb.input_ids, mb.position_ids, mb.logit_index,
                                          mb.target_ids, temperature, logits_chunk, with_entropy,
                                          tree=mb.tree)
        out = model(
            input_ids=mb.input_ids,  # [1, N]
            position_ids=mb.position_ids,  # [1, N]  restarts per row -> block-causal attention
            use_cache=False,  # a cache would disable HF's packed-sequence detection
            logits_to_keep=mb.logit_index,  # [K]  only positions that predict a target
            **tree_forward_kwargs(model, mb.tree),  # prefix sharing: {} when dense
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
