"""The GRPO objective we train, token by token, with its detached statistics.

What "GRPO" means here (everything else in trainer/ feeds this):

1. Advantage: one number per rollout, group-relative: (r - mean) / (std + eps) over the scored
   rollouts of one task (std optional); `None` rewards are out of the baseline and never
   trained (advantages.py). Every trainable token of the rollout carries it.
2. Ratio against the behaviour policy: r = pi_theta(token) / mu(token), where mu is the engine's
   processed logprob captured when the token was sampled. No "old policy" forward: mu IS the
   policy that acted, so one ratio carries both the train/inference mismatch (vLLM kernels vs
   ours) and staleness (weights that moved since sampling). TRL's async GRPO uses the same mu
   but no truncation, so one token with mu = 1e-6 can carry a weight of 1e5.
3. Truncated importance sampling (TIS, token level): the ratio entering the objective is
   min(r, C) (value AND gradient scale; `is_cap` = C). With the clip below it only binds where
   PPO leaves the ratio unbounded: negative advantage, r > 1 + eps_high. It is computed in log
   space, exp(min(log r, log C)), so no log-ratio gives 0/0 or inf/inf (tests at +-120).
4. Clipped surrogate (`loss_type="tis_clip"`, default): -min(r~ A, clip(r~, 1-eps, 1+eps_h) A)
   with r~ = min(r, C): a token already pushed past the trust region stops pushing.
   `loss_type="tis_pg"`: -sg(min(r, C)) A log pi_theta, plain truncated-IS policy gradient.
5. Optional KL to the initial policy (`beta` > 0): k3 = exp(ref - logp) - (ref - logp) - 1 per
   token, added as beta * k3. Off by default (beta = 0), as in DAPO and Dr. GRPO.
6. Normalisation (`loss_norm`): "token" = mean over every trainable token of the step (all
   micro-batches, all ranks), "sequence" = mean over rows of each row's mean. It is carried by
   a per-token weight precomputed at packing (packing.py), so gradient accumulation is a sum.
7. Statistics (detached, as sums so micro-batches and ranks add exactly): ratio mean, low/high
   clip fractions, truncated fraction, k3 KL(mu || pi_theta) = (r - 1) - log r estimated on
   mu's samples, entropy of pi_theta, and |log pi_theta - log mu| (the mismatch itself).

Gradient, for a token inside the trust region: -A * min(r, C) * grad log pi_theta.
Logprobs are taken at the sampling temperature (logits / T), because the engine's processed
logprobs are (DESIGN.md section 2: `--logprobs-mode processed_logprobs`).
"""

from __future__ import annotations

import math

import torch

__all__ = ["STAT_KEYS", "chunked_token_logprobs", "policy_loss", "token_logprobs"]

STAT_KEYS = ("tokens", "ratio", "clip_low", "clip_high", "truncated", "kl_behaviour", "entropy",
             "abs_logp_diff", "kl_ref")


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, *, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability of each target at `temperature`, and the (detached) entropy.

    logits [K, V] (positions that predict a target), targets [K] -> logp [K], entropy [K] | None
    """
    scaled = logits.float() / temperature  # [K, V]
    logsm = torch.log_softmax(scaled, dim=-1)  # [K, V]
    logp = logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [K]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logsm.exp() * logsm).sum(-1)  # [K]
    return logp, entropy


class _ChunkedLogprob(torch.autograd.Function):
    """log softmax(h W^T / T)[target] over chunks of tokens, never all [K, V] logits at once.

    Forward keeps only the logsumexp per token ([K] fp32); backward recomputes one chunk's
    logits at a time: d logp / d z = (onehot - softmax) / T, then dh = dz W and dW = dz^T h.
    Peak extra memory is one chunk's [chunk, V] fp32 logits (and their softmax), whatever K is.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk):  # noqa: ANN001, ANN205
        k = hidden.shape[0]
        logp = hidden.new_empty(k, dtype=torch.float32)  # [K]
        lse_all = hidden.new_empty(k, dtype=torch.float32)  # [K]
        for s in range(0, k, chunk):
            z = (hidden[s:s + chunk] @ weight.t()).float() / temperature  # [c, V]
            lse = torch.logsumexp(z, dim=-1)  # [c]
            lse_all[s:s + chunk] = lse
            logp[s:s + chunk] = z.gather(-1, targets[s:s + chunk, None]).squeeze(-1) - lse
        ctx.save_for_backward(hidden, weight, targets, lse_all)
        ctx.temperature, ctx.chunk = temperature, chunk
        return logp

    @staticmethod
    def backward(ctx, grad_logp):  # noqa: ANN001, ANN205
        hidden, weight, targets, lse_all = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if need_w else None
        for s in range(0, hidden.shape[0], chunk):
            h = hidden[s:s + chunk]  # [c, H]
            z = (h @ weight.t()).float() / t  # [c, V]
            p = torch.exp(z - lse_all[s:s + chunk, None])  # [c, V]  softmax
            # d logp_i / d z_ij = (1[j = target_i] - p_ij) / T, times the upstream gradient
            dz = p.mul_(-grad_logp[s:s + chunk, None].float() / t)  # [c, V]
            dz.scatter_add_(-1, targets[s:s + chunk, None],
                            grad_logp[s:s + chunk, None].float() / t)
            dz = dz.to(hidden.dtype)
            if need_h:
                grad_h[s:s + chunk] = dz @ weight  # [c, H]
            if need_w:
                grad_w += (dz.t() @ h).float()  # [V, H]
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None


def chunked_token_logprobs(
    hidden: torch.Tensor, lm_head: torch.nn.Module, targets: torch.Tensor, temperature: float,
    *, chunk: int = 1024, with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_logprobs(lm_head(hidden), ...)` without a [K, V] fp32 tensor for the whole row.

    hidden [K, H] (final-norm hidden states at positions that predict a target), targets [K]
    -> logp [K] fp32 (with grad to hidden and lm_head.weight), entropy [K] | None (detached).
    Logits are computed in the dtype autocast would give lm_head (bf16 under bf16 autocast or
    FSDP mixed precision), then upcast to fp32 for the softmax, as the dense path does. At a
    152k vocabulary the dense path holds ~4 [K, V] fp32 tensors (6 GB each at 10k tokens); this
    holds one [chunk, V] at a time (0.6 GB at chunk 1024), at the price of recomputing the
    logits matmul in backward. Gradients equal the dense path's (tests/test_trainer_memory.py).
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk}: must be >= 1 tokens")
    weight = lm_head.weight  # [V, H]
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError("chunked_token_logprobs: an lm_head with a bias is not supported; "
                         "use token_logprobs on the model's logits")
    dtype = hidden.dtype
    if torch.is_autocast_enabled(hidden.device.type):
        dtype = torch.get_autocast_dtype(hidden.device.type)
    h, w = hidden.to(dtype), weight.to(dtype)
    with torch.autocast(hidden.device.type, enabled=False):
        logp = _ChunkedLogprob.apply(h, w, targets, float(temperature), int(chunk))  # [K]
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = torch.empty_like(logp)  # [K]
                for s in range(0, h.shape[0], chunk):
                    z = (h[s:s + chunk] @ w.t()).float() / temperature  # [c, V]
                    logsm = torch.log_softmax(z, dim=-1)  # [c, V]
                    entropy[s:s + chunk] = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def policy_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    token_weight: torch.Tensor,
    *,
    loss_type: str = "tis_clip",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    is_cap: float = 2.0,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    stats_tensor: bool = False,
) -> tuple[torch.Tensor, dict[str, float] | torch.Tensor]:
    """Weighted sum of per-token losses (a scalar with grad) and detached stat SUMS.

    All inputs are [K] over the trainable tokens of one micro-batch. `token_weight` carries the
    normalisation (sums to 1 over the whole step), so the step's loss is the sum over its
    micro-batches. Stats are sums; divide by stats["tokens"] after adding micro-batches up.
    `stats_tensor=True` returns them as one float64 tensor [len(STAT_KEYS)] on the logits'
    device instead, so a training loop can add micro-batches up without a host sync each.
    """
    eps_high = epsilon if epsilon_high is None else epsilon_high
    log_ratio = logp - behaviour_logp  # [K]  log(pi_theta / mu)
    # r~ = min(r, C) in log space: exp(min(log r, log C) + (log r - sg(log r))). Its value is
    # min(r, C) and its gradient min(r, C) * grad log pi, and the exponent never exceeds log C.
    # Forming r = exp(log r) first and then min(r, C) / r is 0/0 once log r < -104 (r underflows)
    # and inf/inf once log r > 88 (r overflows) in float32: NaN in the loss (issue 16).
    lr = log_ratio.detach()  # [K]
    trunc_ratio = torch.exp(lr.clamp(max=math.log(is_cap)) + (log_ratio - lr))  # [K]  r~
    if loss_type == "tis_clip":
        surr = trunc_ratio * advantages  # [K]
        clipped = trunc_ratio.clamp(1 - epsilon, 1 + eps_high) * advantages  # [K]
        per_token = -torch.min(surr, clipped)  # [K]
    elif loss_type == "tis_pg":
        per_token = -trunc_ratio.detach() * advantages * logp  # [K]
    else:
        raise ValueError(f"loss_type={loss_type!r}: choose tis_clip or tis_pg")
    kl_ref = None
    if beta > 0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs ref_logp (the reference model's logprobs)")
        d = ref_logp - logp  # [K]  log(ref / pi_theta)
        kl_ref = torch.exp(d) - d - 1  # [K]  k3 estimator of KL(pi_theta || ref)
        per_token = per_token + beta * kl_ref  # [K]
    loss = (per_token * token_weight).sum()  # []  normalised by the precomputed weights
    with torch.no_grad():
        # Statistics in float64: r = exp(log r) is finite there up to log r = 709, so a token
        # with log r = +120 reports its true (huge) ratio instead of inf (float32 overflows at 88).
        live = (token_weight > 0).double()  # [K]  0 only in FSDP padding micro-batches
        lr64 = lr.double()  # [K]
        r = lr64.exp()  # [K]  r
        a = advantages  # [K]
        zero = r.new_zeros(())
        sums = torch.stack([  # one device->host copy per micro-batch, in STAT_KEYS order
            live.sum(),
            (r * live).sum(),
            (((r < 1 - epsilon) & (a < 0)).float() * live).sum(),
            (((r > 1 + eps_high) & (a > 0)).float() * live).sum(),
            ((r > is_cap).float() * live).sum(),
            (((r - 1) - lr64) * live).sum(),
            zero if entropy is None else (entropy.double() * live).sum(),
            (lr64.abs() * live).sum(),
            zero if kl_ref is None else (kl_ref.detach().double() * live).sum(),
        ])  # [9]
        if stats_tensor:
            return loss, sums
        stats = dict(zip(STAT_KEYS, sums.tolist(), strict=True))
    return loss, stats
