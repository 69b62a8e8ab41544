"""GRPO maths against hand computation: advantages, the TIS-clipped loss, staleness rules.

Run: .venv/bin/python -m pytest tests/test_trainer_maths.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from trainer.advantages import group_advantages
from trainer.fakes import make_trace, make_turn
from trainer.loss import policy_loss
from trainer.rows import trace_to_rows
from trainer.staleness import apply_staleness

# Three tokens, cap C = 2, clip (0.8, 1.28):
#   token 1: log mu = -1.0, log pi = -1.0 -> r = 1                 A = +1
#   token 2: log mu = -1.0, log pi = -0.5 -> r = e^0.5 = 1.6487    A = +1
#   token 3: log mu = -2.0, log pi = -1.0 -> r = e^1.0 = 2.7183    A = -1
MU = torch.tensor([-1.0, -1.0, -2.0])
LOGP = [-1.0, -0.5, -1.0]
ADV = torch.tensor([1.0, 1.0, -1.0])
W = torch.full((3,), 1 / 3)  # "token" normalisation over 3 trainable tokens


def _loss(loss_type: str):
    logp = torch.tensor(LOGP, requires_grad=True)
    loss, stats = policy_loss(logp, MU, ADV, W, loss_type=loss_type, epsilon=0.2,
                              epsilon_high=0.28, is_cap=2.0)
    loss.backward()
    return loss.item(), logp.grad.tolist(), stats


def test_tis_clip_loss_of_the_three_token_case_matches_the_hand_computation():
    # token 1: r~ = 1, surr = 1, clipped = 1            -> -min = -1
    # token 2: r~ = 1.6487, clipped at 1.28 (A > 0)      -> -min(1.6487, 1.28) = -1.28
    # token 3: r~ = min(2.7183, C=2) = 2, A = -1: surr = -2, clipped = -1.28 -> -min = +2
    # loss = (-1 - 1.28 + 2) / 3 = -0.093333
    loss, _, _ = _loss("tis_clip")
    assert loss == pytest.approx(-0.28 / 3, abs=1e-6)


def test_tis_clip_gradient_is_minus_advantage_times_truncated_ratio_and_zero_when_clipped():
    # d loss / d log pi = -A * min(r, C) * w  where the surrogate is active, 0 where clipped:
    # token 1: -(+1)(1)/3 = -0.3333 ; token 2: clipped -> 0 ; token 3: -(-1)(2)/3 = +0.6667
    _, grad, _ = _loss("tis_clip")
    assert grad == pytest.approx([-1 / 3, 0.0, 2 / 3], abs=1e-6)


def test_tis_pg_gradient_keeps_every_token_with_its_truncated_weight():
    # -sg(min(r, C)) * A * log pi: token 2 is not clipped here: -(1.6487)/3 = -0.5496
    _, grad, _ = _loss("tis_pg")
    assert grad == pytest.approx([-1 / 3, -math.exp(0.5) / 3, 2 / 3], abs=1e-6)


def test_loss_statistics_of_the_three_token_case():
    _, _, s = _loss("tis_clip")
    assert s["tokens"] == 3
    # ratio mean = (1 + 1.6487 + 2.7183) / 3 = 1.7890
    assert s["ratio"] / 3 == pytest.approx((1 + math.exp(0.5) + math.e) / 3, abs=1e-5)
    assert (s["clip_high"], s["clip_low"], s["truncated"]) == (1, 0, 1)
    # k3 KL(mu || pi) = (r - 1) - log r: 0 + (0.6487 - 0.5) + (1.7183 - 1) = 0.8670
    assert s["kl_behaviour"] == pytest.approx(math.exp(0.5) - 1.5 + math.e - 2, abs=1e-5)


def test_reference_kl_adds_beta_times_k3():
    # ref = pi on tokens 1-2 and log ref = -2 on token 3: d = -1, k3 = e^-1 + 1 - 1 = 0.3679
    logp = torch.tensor(LOGP)
    base, _ = policy_loss(logp, MU, ADV, W, is_cap=2.0, epsilon_high=0.28)
    ref = torch.tensor([-1.0, -0.5, -2.0])
    with_kl, s = policy_loss(logp, MU, ADV, W, is_cap=2.0, epsilon_high=0.28, beta=0.1,
                             ref_logp=ref)
    assert (with_kl - base).item() == pytest.approx(0.1 * math.exp(-1) / 3, abs=1e-6)
    assert s["kl_ref"] == pytest.approx(math.exp(-1), abs=1e-6)


def test_advantages_are_mean_centred_and_std_scaled():
    # rewards 1, 0, 0, 1: mean 0.5, population std 0.5 -> +-1 (eps 1e-4 aside)
    a = group_advantages([1.0, 0.0, 0.0, 1.0], scale_rewards=True)
    assert a.advantages == pytest.approx([1, -1, -1, 1], abs=1e-3)
    b = group_advantages([1.0, 0.0, 0.0, 1.0], scale_rewards=False)
    assert b.advantages == pytest.approx([0.5, -0.5, -0.5, 0.5])


def test_a_none_reward_is_left_out_of_the_baseline_and_gets_no_advantage():
    # baseline over {1, 0} = 0.5, not over {1, 0, 0} = 0.33 (None is not zero)
    a = group_advantages([1.0, None, 0.0], scale_rewards=False)
    assert a.advantages == [0.5, None, -0.5] and a.n_scored == 2


@pytest.mark.parametrize(("rewards", "reason"), [
    ([0.0, 0.0, 0.0], "zero_variance"),
    ([None, None], "no_scored"),
    ([1.0, None], "single_scored"),
])
def test_a_group_that_cannot_give_a_gradient_is_skipped_with_its_reason(rewards, reason):
    a = group_advantages(rewards)
    assert a.skipped == reason and all(x is None for x in a.advantages)


def _stale_row():
    trace = make_trace(make_turn([1], [2, 3], node_id="a", version=0),
                       make_turn([1, 2, 3], [4], node_id="b", version=3))
    return trace_to_rows(trace)[0]


def test_tokens_over_the_staleness_bound_are_dropped_to_context_by_rule_drop():
    rows = _stale_row()  # at version 4: tokens 2, 3 are 4 versions old, token 4 is 1 old
    masks, stats = apply_staleness(rows, policy_version=4, max_staleness=2, rule="drop")
    assert masks[0] == [0, 0, 0, 1] and rows[0].loss_mask == [0, 1, 1, 1]  # row untouched
    assert (stats.over_bound_tokens, stats.dropped_tokens, stats.staleness_max) == (2, 2, 4)


def test_tokens_over_the_staleness_bound_train_and_are_counted_by_rule_correct():
    rows = _stale_row()
    masks, stats = apply_staleness(rows, policy_version=4, max_staleness=2, rule="correct")
    assert masks[0] == [0, 1, 1, 1]
    assert (stats.over_bound_tokens, stats.dropped_tokens, stats.stale_tokens) == (2, 0, 3)


def test_a_turn_that_straddled_a_weight_update_ages_from_its_start_version():
    """Sampling began under version 1 and ended under 3: at version 3 with max_staleness 1 its
    tokens are 2 versions old (over the bound), not 0 (what the end version would say)."""
    trace = make_trace(make_turn([1], [2, 3], node_id="a", version=(1, 3)))
    rows, report = trace_to_rows(trace)
    assert report.straddled_turns == 1
    masks, stats = apply_staleness(rows, policy_version=3, max_staleness=1, rule="drop")
    assert masks[0] == [0, 0, 0]  # dropped to context
    assert (stats.over_bound_tokens, stats.dropped_tokens, stats.staleness_max) == (2, 2, 2)
    masks, stats = apply_staleness(rows, policy_version=3, max_staleness=1, rule="correct")
    assert masks[0] == [0, 1, 1] and stats.staleness_sum == 4 and stats.stale_tokens == 2
