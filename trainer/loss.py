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

__all__ = ["STAT_KEYS", "policy_loss", "token_logprobs"]

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
