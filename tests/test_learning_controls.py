# Run: .venv/bin/python -m pytest tests/test_learning_controls.py -x -q
"""The controls bench/learning runs beside every seed (issue 32): flipped rewards (r -> 1 - r,
the pass rate must fall) and learning rate 0 (every step runs and pushes, the weights never
move: the before/after change is evaluation noise), next to the shuffled rewards tested in
test_learning_instruments.py. Each reaches the trainer from the command line, and the flip
reverses every advantage a group would have had."""

from __future__ import annotations

import random

from harness.shared.run_config import build_parser, settings_from_args
from trainer.config import AsyncGRPOConfig
from trainer.fakes import synthetic_trace
from trainer.groups import prepare_group
from trainer.rollouts import Rollout, RolloutOutcome


def _rollout(reward: float | None, cause: str = "ok", seed: int = 0) -> Rollout:
    outcome = RolloutOutcome(env_reward=reward, completion=[], trace=[], tool_call_count=1,
                             tool_failure_count=0, tool_calls_by_name={"bash": 1},
                             timed_out=False)
    return Rollout(cause=cause, trace=synthetic_trace(random.Random(seed)), outcome=outcome,
                   env_reward=reward, episode_id=f"e{seed}")


def _group(rewards: list[float], causes: list[str], *, flip: bool):
    results = [_rollout(r, c, i) if c != "infra_failure" else Rollout(cause=c, error="died")
               for i, (r, c) in enumerate(zip(rewards, causes, strict=True))]
    return prepare_group(results, group_index=0, reward_funcs=[], scale_rewards=True,
                         dispatch_version=0, flip=flip)


def test_flipped_rewards_reverse_every_advantage_and_never_pay_a_tampered_rollout():
    rewards = [1.0, 0.0, 1.0, 0.25, None, 0.0]
    causes = ["ok", "ok", "tampered", "ok", "infra_failure", "model_failure"]
    plain, flipped = _group(rewards, causes, flip=False), _group(rewards, causes, flip=True)
    assert plain.rewards == [1.0, 0.0, 0.0, 0.25, None, 0.0]  # tampered scored 0
    assert flipped.rewards == [0.0, 1.0, 0.0, 0.75, None, 1.0]  # tampered keeps its 0
    for i in (0, 1, 3, 5):
        assert flipped.per_rollout[i]["reward_unflipped"] == plain.rewards[i]
        assert flipped.per_rollout[i]["reward"] == flipped.rewards[i]
    assert "reward_unflipped" not in flipped.per_rollout[2]
    # The best rollout of the plain group is pushed down under the flip, the worst up.
    adv = lambda g, i: g.per_rollout[i]["advantage"]  # noqa: E731
    assert adv(plain, 0) > 0 > adv(flipped, 0)
    assert adv(plain, 1) < 0 < adv(flipped, 1)


def test_the_controls_reach_the_trainer_and_refuse_to_be_combined():
    parser = build_parser("t", "d")
    s = settings_from_args(parser, ["--flip-rewards"])
    assert s.trainer_config().flip_rewards and not s.trainer_config().shuffle_rewards
    zero = settings_from_args(build_parser("t", "d"), ["--learning-rate", "0"])
    assert zero.trainer_config().learning_rate == 0
    assert not any("learning_rate" in p for p in zero.trainer_config().validate())
    both = AsyncGRPOConfig(shuffle_rewards=True, flip_rewards=True)
    assert any("two controls" in p for p in both.validate())
    for bad in (-1e-4, float("nan"), float("inf")):
        assert any("learning_rate" in p for p in AsyncGRPOConfig(learning_rate=bad).validate())


def _one_step(out, advantages: list[float], **config):
    """One real trainer step (trainer.loop.run_step) of a tiny seeded Qwen3 on two rows: (the
    weights before, the weights after, the trainer), weights flattened into one tensor."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from trainer.fakes import ReplaySource, make_trace, make_turn
    from trainer.grpo import HarnessAsyncGRPOTrainer
    from trainer.loop import StepInput, run_step
    from trainer.rows import trace_to_rows

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        max_position_embeddings=64, tie_word_embeddings=True)).float()
    args = AsyncGRPOConfig(num_generations=2, max_steps=1, output_dir=str(out),
                           report_to="none", **config)
    assert not args.validate()
    source = ReplaySource(lambda s, k: None, lambda s, k: None)
    trainer = HarnessAsyncGRPOTrainer(model, lambda sampling: source, args)
    rows = [trace_to_rows(make_trace(make_turn([5, 6, 7], c, node_id=n)))[0][0]
            for c, n in (([40, 41], "g"), ([90, 91], "b"))]
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    run_step(trainer, StepInput(rows=rows, advantages=advantages))
    return before, torch.cat([p.detach().flatten() for p in model.parameters()]), trainer


def test_a_trainer_step_at_learning_rate_zero_runs_and_moves_no_weight(tmp_path):
    # With gradients that move the weights at lr 1e-2: at 0 the step still runs (the version
    # advances, so the push happens) and every parameter stays bit for bit where it was.
    import torch

    before, after, trainer = _one_step(tmp_path / "0", [1.0, -1.0], learning_rate=0.0)
    assert trainer.state.policy_version == 1
    assert torch.equal(before, after)
    before, after, _ = _one_step(tmp_path / "1e-2", [1.0, -1.0], learning_rate=1e-2)
    assert not torch.equal(before, after)  # the same step at a real rate does move them


def test_the_kl_anchor_reaches_the_trainer_from_the_command_line():
    """--beta (TRL's name) is the trainer's k3 KL coefficient to the initial policy; 0 by
    default (no reference model is built); train-only; a negative one is refused by name."""
    assert settings_from_args(build_parser("t", "d"), []).trainer_config().beta == 0.0
    anchored = settings_from_args(build_parser("t", "d"), ["--beta", "0.2", "--shuffle-rewards"])
    config = anchored.trainer_config()
    assert config.beta == 0.2 and config.shuffle_rewards
    assert not config.validate()
    negative = settings_from_args(build_parser("t", "d"), ["--beta", "-0.1"]).trainer_config()
    assert any(p.startswith("beta=-0.1") for p in negative.validate())
    eval_flags = build_parser("e", "d", eval_mode=True).format_help()
    assert "--beta" not in eval_flags and "--learning-rate" not in eval_flags


def test_sgd_steps_are_linear_in_the_gradient_where_adamw_steps_are_not(tmp_path):
    """--optimizer sgd: doubling every advantage doubles the update (so updates on rewards that
    carry no information cancel as their gradients do); AdamW's first update is about
    lr x sign(gradient), the same for both. The real trainer's step, clipping off."""
    import torch

    def update(optimizer: str, lr: float, scale: float) -> torch.Tensor:
        before, after, trainer = _one_step(tmp_path / f"{optimizer}-{scale}", [scale, -scale],
                                           learning_rate=lr, optimizer=optimizer,
                                           max_grad_norm=None)
        assert type(trainer.optimizer).__name__ == {"sgd": "SGD", "adamw": "AdamW"}[optimizer]
        return after - before

    sgd_1, sgd_2 = update("sgd", 1.0, 1.0), update("sgd", 1.0, 2.0)
    assert sgd_1.abs().max() > 1e-3
    # atol: two fp32 roundings of a weight near 1 (the norms' scales), 1.2e-7 each
    torch.testing.assert_close(sgd_2, 2 * sgd_1, rtol=1e-4, atol=2.5e-7)
    adam_1, adam_2 = update("adamw", 1e-3, 1.0), update("adamw", 1e-3, 2.0)
    # Each weight moves by ~lr x sign(g) either way (less only where |g| is near Adam's eps).
    assert adam_2.abs().max() <= 1e-3 * 1.0001
    assert (adam_2 - adam_1).norm() < 0.05 * adam_1.norm()


def test_the_optimizer_reaches_the_trainer_and_a_wrong_one_is_refused_by_name():
    assert settings_from_args(build_parser("t", "d"), []).trainer_config().optimizer == "adamw"
    sgd = settings_from_args(build_parser("t", "d"), ["--optimizer", "sgd"]).trainer_config()
    assert sgd.optimizer == "sgd" and not sgd.validate()
    bad = settings_from_args(build_parser("t", "d"), ["--optimizer", "lion"]).trainer_config()
    assert any(p.startswith("optimizer='lion'") for p in bad.validate())
    assert "--optimizer" not in build_parser("e", "d", eval_mode=True).format_help()


def test_sgd_gets_its_own_default_rate_on_the_tiny_models_and_asks_for_one_otherwise(tmp_path):
    from harness.run.preflight import preflight
    from harness.shared.run_config import (
        MODEL_LEARNING_RATE,
        TINY_LEARNING_RATE,
        TINY_SGD_LEARNING_RATE,
        RunSettings,
    )

    assert RunSettings().learning_rate == TINY_LEARNING_RATE
    assert RunSettings(optimizer="sgd").learning_rate == TINY_SGD_LEARNING_RATE
    own = str(tmp_path / "my-model")
    assert RunSettings(model=own).learning_rate == MODEL_LEARNING_RATE
    assert RunSettings(model=own, optimizer="sgd", learning_rate=0.1).learning_rate == 0.1
    unset = RunSettings(model=own, optimizer="sgd")
    assert unset.learning_rate is None  # AdamW's 1e-6 would silently not move it under SGD
    problems = preflight(unset, train=True)
    assert any(p.startswith(f"--optimizer sgd with --model {own}: give --learning-rate")
               for p in problems), problems
