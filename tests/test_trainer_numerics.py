"""Numerics of a step: bf16 on fp32 master weights, a TIS weight that cannot be 0/0, and
non-finite losses, gradients and rewards that never reach the weights or the engine.

Run: .venv/bin/python -m pytest tests/test_trainer_numerics.py -q
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.helpers.trainer import seeded_tiny_model
from trainer.advantages import group_advantages
from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, synthetic_trace
from trainer.groups import prepare_group
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.loop import StepInput, run_step
from trainer.loss import policy_loss
from trainer.rewards import score_rollout
from trainer.rollouts import Rollout
from trainer.rows import trace_to_rows


class RecordingSync:
    """A WeightSync that keeps what it was sent, and how the stream was read."""

    def __init__(self) -> None:
        self.pushed: dict[int, dict[str, torch.Tensor]] = {}
        self.read_counts: list[int] = []

    def push(self, model, version: int) -> None:
        got = {}
        for name, tensor in model.named_parameters():
            got[name] = tensor.clone()
            self.read_counts.append(model.read)  # gathers done so far: one per element read
        self.pushed[version] = got


def _rows_and_advantages():
    rows = []
    for k in range(4):
        rows += trace_to_rows(synthetic_trace(random.Random(k), vocab=500, prompt_len=12,
                                              completion_len=6, tool_len=4))[0]
    return rows, [1.0, -1.0, 0.5, -0.5]


def _trainer(tmp_path, dtype: str, lr: float, **kw) -> HarnessAsyncGRPOTrainer:
    args = AsyncGRPOConfig(num_generations=2, max_steps=1, learning_rate=lr, dtype=dtype,
                           output_dir=str(tmp_path / dtype), report_to="none")
    source = ReplaySource(lambda s, k: None, lambda s, k: None)
    return HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: source, args, **kw)


def _one_step_delta(tmp_path, dtype: str) -> tuple[torch.Tensor, HarnessAsyncGRPOTrainer]:
    trainer = _trainer(tmp_path, dtype, lr=1e-6)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    rows, adv = _rows_and_advantages()
    run_step(trainer, StepInput(rows=rows, advantages=adv))
    delta = [(p.detach() - b).flatten() for p, b in zip(trainer.model.parameters(), before,
                                                          strict=True)]
    return torch.cat(delta), trainer


# --- bf16 keeps fp32 master weights ---------------------------------------------------------------
def test_a_bf16_step_of_lr_1e_6_moves_the_weights_as_the_fp32_reference_does(tmp_path):
    ref, _ = _one_step_delta(tmp_path, "float32")
    bf16, trainer = _one_step_delta(tmp_path, "bfloat16")
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())  # master weights
    assert trainer.autocast_dtype == torch.bfloat16  # the forward ran in bf16
    moved_ref = ref != 0
    assert moved_ref.float().mean() > 0.9  # the reference: Adam's first step moves ~every weight
    # Measured: 100% of the reference's moved elements move in bf16, 99.8% in the same direction.
    assert ((bf16 != 0) & moved_ref).sum() / moved_ref.sum() > 0.9
    assert (torch.sign(bf16) == torch.sign(ref))[moved_ref].float().mean() > 0.9
    assert not torch.equal(bf16, ref)  # the bf16 forward really differed from the fp32 one


def test_the_same_step_on_pure_bf16_weights_would_round_back_most_of_them():
    # What issue 16 measured and the test above guards against: AdamW on bf16 parameters.
    # Adam's first step is ~lr * sign(g) = 1e-6, under half a bf16 ulp of most N(0, 0.02) weights.
    torch.manual_seed(0)
    w = (torch.randn(100_000) * 0.02).bfloat16().requires_grad_()
    w.grad = torch.randn(100_000).bfloat16()
    before = w.detach().clone()
    torch.optim.AdamW([w], lr=1e-6, weight_decay=0.0).step()
    assert (w.detach() != before).float().mean() < 0.05  # measured: 2.0%


def test_the_engine_gets_the_compute_dtype_streamed_one_gathered_parameter_at_a_time(tmp_path):
    sync = RecordingSync()
    trainer = _trainer(tmp_path, "bfloat16", lr=1e-3, weight_sync=sync)
    rows, adv = _rows_and_advantages()
    run_step(trainer, StepInput(rows=rows, advantages=adv, sync=True))
    sent = sync.pushed[1]
    master = dict(trainer.model.named_parameters())
    assert set(sent) == set(master)
    for name, tensor in sent.items():
        assert tensor.dtype == torch.bfloat16, name
        assert torch.equal(tensor, master[name].detach().to(torch.bfloat16)), name
    # Lazy: the k-th element was gathered when it was read, not all of them up front.
    assert sync.read_counts == list(range(1, len(master) + 1))


# --- the TIS weight in log space --------------------------------------------------------------------
@pytest.mark.parametrize("loss_type", ["tis_clip", "tis_pg"])
def test_the_truncated_ratio_is_finite_at_log_ratios_of_plus_and_minus_120(loss_type):
    # log r = +120: r~ = min(r, C) = C = 2. log r = -120: r~ = e^-120, which is 0 in float32.
    # Per-token gradient (inside the trust region, or tis_pg): -A * r~ * w, w = 1/4.
    #   token 0: log r = +120, A = -1 -> +2/4 = 0.5 (tis_clip: surr -2 < clipped -1.28: active)
    #   token 1: log r = -120, A = +1 -> -0 (r~ underflows to 0: no push, no NaN)
    #   token 2: log r = -120, A = -1 -> tis_clip: clipped at 0.8 -> 0 ; tis_pg: +0
    #   token 3: log r = +120, A = +1 -> tis_clip: clipped at 1.28 -> 0 ; tis_pg: -2/4
    mu = torch.tensor([-125.0, -1.0, -1.0, -125.0])
    logp = torch.tensor([-5.0, -121.0, -121.0, -5.0], requires_grad=True)
    adv = torch.tensor([-1.0, 1.0, -1.0, 1.0])
    loss, stats = policy_loss(logp, mu, adv, torch.full((4,), 0.25), loss_type=loss_type,
                              is_cap=2.0)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
    expected = [0.5, 0.0, 0.0, 0.0] if loss_type == "tis_clip" else [0.5, 0.0, 0.0, -0.5]
    assert logp.grad.tolist() == pytest.approx(expected, abs=1e-7)
    # Statistics are float64: the true mean ratio (e^120 / 2) is reported, not inf or NaN.
    assert stats["ratio"] == pytest.approx(2 * math.exp(120), rel=1e-6)
    assert stats["truncated"] == 2.0 and all(math.isfinite(v) for v in stats.values())
    # The form this replaces, r * (min(r, C) / r), is inf * 0 at +120 and 0 * (0/0) at -120:
    r = torch.exp(torch.tensor([120.0, -120.0]))
    assert torch.isnan(r * (r.clamp(max=2.0) / r)).all()


def test_the_log_space_truncated_ratio_equals_min_r_c_where_the_old_form_was_finite():
    lr = torch.linspace(-6, 6, 49)
    logp = lr.clone().requires_grad_()
    adv = torch.ones(49)
    loss, _ = policy_loss(logp, torch.zeros(49), adv, torch.ones(49), loss_type="tis_pg",
                          is_cap=2.0)
    loss.backward()
    # tis_pg: d/dlogp = -A * min(r, C)
    assert (-logp.grad).tolist() == pytest.approx(torch.exp(lr).clamp(max=2.0).tolist(),
                                                  rel=1e-6)


# --- non-finite steps are skipped, counted and never pushed -----------------------------------------
def _nan_logits_once(trainer):
    """Fault injection: the next forward's logits are NaN (weights stay finite).

    Through the final norm's output: the trainer applies lm_head in chunks to the decoder's
    hidden states (trainer/forward.py), so NaN hidden states are NaN logits."""
    handle = None

    def hook(module, args, output):
        handle.remove()
        return output * float("nan")

    handle = trainer.model.model.norm.register_forward_hook(hook)


def _inf_grad_once(trainer):
    """Fault injection: one parameter's gradient is inf in the next backward (loss finite)."""
    param = trainer.model.model.norm.weight
    handle = None

    def hook(grad):
        handle.remove()
        return grad * float("inf")

    handle = param.register_hook(hook)


@pytest.mark.parametrize("inject", [_nan_logits_once, _inf_grad_once], ids=["loss", "grad"])
def test_a_non_finite_step_makes_no_update_is_counted_and_is_not_pushed(tmp_path, inject):
    sync, versions = RecordingSync(), []
    trainer = _trainer(tmp_path, "float32", lr=1e-3, weight_sync=sync, on_version=versions.append)
    rows, adv = _rows_and_advantages()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    inject(trainer)
    bad = run_step(trainer, StepInput(rows=rows, advantages=adv, sync=True))
    assert bad["steps/nonfinite_skipped"] == 1.0 and bad["steps/nonfinite_total"] == 1.0
    assert not (math.isfinite(bad["loss"]) and math.isfinite(bad["grad_norm"]))
    assert trainer.state.policy_version == 0 and sync.pushed == {} and versions == []
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True))
    assert all(p.grad is None for p in trainer.model.parameters())  # nothing carried over
    good = run_step(trainer, StepInput(rows=rows, advantages=adv, sync=True))
    assert good["steps/nonfinite_skipped"] == 0.0 and good["steps/nonfinite_total"] == 1.0
    assert trainer.state.policy_version == 1 and list(sync.pushed) == [1] and versions == [1]
    assert all(torch.isfinite(t).all() for t in sync.pushed[1].values())
    assert trainer.state.nonfinite_steps == 1  # saved with checkpoints (TrainerState)


# --- non-finite rewards are unscorable ----------------------------------------------------------------
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_verifier_reward_is_unscorable_and_counted(bad):
    scored = score_rollout(None, bad, [])
    assert scored.total is None and scored.failure.startswith("env_reward:")
    trace = synthetic_trace(random.Random(0), vocab=500)
    rollouts = [Rollout(cause="ok", trace=trace, env_reward=r, episode_id=f"e{i}")
                for i, r in enumerate([bad, 1.0, 0.0])]
    g = prepare_group(rollouts, group_index=0, reward_funcs=[], scale_rewards=True,
                      dispatch_version=0)
    assert g.rewards == [None, 1.0, 0.0] and g.causes["reward_failure"] == 1
    assert g.env_rewards == [1.0, 0.0]  # reward/correctness means stay finite
    assert all(math.isfinite(a) for a in g.row_advantages) and g.row_advantages


def test_group_advantages_leave_non_finite_rewards_out_of_the_baseline():
    adv = group_advantages([float("nan"), float("inf"), 1.0, 0.0], scale_rewards=False)
    assert adv.advantages == [None, None, 0.5, -0.5] and adv.n_scored == 2
