# .venv/bin/python -m pytest tests/test_reward_shuffle.py -x -q
"""The shuffled-reward control's balanced permutations (trainer/reward_shuffle.py).

What must hold: every group is paid a permutation of its own rewards (nothing invented, nothing
lost, tampered and unscorable rollouts untouched); over a run, the balanced permutations' net
signal toward the earned rewards stays near zero while uniform ones wander like a random walk
(what made issue 32's shuffled runs drift, in the direction of that sum, 5 of 5); the choice is
seeded; and the setting reaches the trainer from the command line and is checked.
"""

from __future__ import annotations

import random

import pytest

from harness.shared.run_config import build_parser, settings_from_args
from trainer.config import AsyncGRPOConfig
from trainer.fakes import synthetic_trace
from trainer.groups import append_group_records, group_metrics, prepare_group
from trainer.reward_shuffle import RewardShuffle, shuffle_signal
from trainer.rollouts import Rollout, RolloutOutcome


def _binary_groups(count: int, seed: int = 1) -> list[list[float]]:
    """Groups of 8 binary rewards with 1 to 7 passes, like a policy part-way through learning."""
    rng = random.Random(seed)
    groups = []
    for _ in range(count):
        passes = rng.randint(1, 7)
        group = [1.0] * passes + [0.0] * (8 - passes)
        rng.shuffle(group)
        groups.append(group)
    return groups


def _run(mode: str, seed: int, groups: list[list[float]]) -> tuple[RewardShuffle, float]:
    shuffle = RewardShuffle(seed, mode)  # type: ignore[arg-type]
    worst = 0.0
    for index, earned in enumerate(groups):
        paid, signal = shuffle.permute(index, earned)
        assert sorted(paid) == sorted(earned)  # a permutation: the same rewards, reordered
        assert signal == pytest.approx(shuffle_signal(earned, paid))
        worst = max(worst, abs(shuffle.net_signal))
    return shuffle, worst


def test_the_signal_is_zero_without_spread_and_largest_when_the_rewards_stay_put():
    assert shuffle_signal([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 0.0
    earned = [1.0, 0.0, 0.0, 1.0]
    assert shuffle_signal(earned, earned) == pytest.approx(4 * 0.5)  # n x std: a real run's
    assert shuffle_signal(earned, [0.0, 1.0, 1.0, 0.0]) == pytest.approx(-2.0)  # flipped


def test_balanced_keeps_the_runs_net_signal_near_zero_where_uniform_wanders():
    groups = _binary_groups(500)
    real = sum(shuffle_signal(g, g) for g in groups)  # what training on the earned rewards gives
    for seed in range(3):
        _, balanced_worst = _run("balanced", seed, groups)
        _, uniform_worst = _run("uniform", seed, groups)
        assert balanced_worst < 2.0, balanced_worst  # one group's signal is up to ~4
        assert uniform_worst > 10 * balanced_worst, (uniform_worst, balanced_worst)
        assert balanced_worst < real / 500  # under 0.2% of the real run's push, all run long


def test_balanced_moves_the_rewards_off_the_rollouts_that_earned_them_as_often_as_uniform():
    # Not the identity in disguise: a rollout is paid its own reward about as often as under a
    # uniform permutation (measured: 62.7% and 61.7% of rollouts here; identity: 100%).
    kept = {}
    for mode in ("balanced", "uniform"):
        shuffle = RewardShuffle(0, mode)  # type: ignore[arg-type]
        same = total = 0
        for index, earned in enumerate(_binary_groups(300, seed=2)):
            paid, _ = shuffle.permute(index, earned)
            same += sum(p == e for p, e in zip(paid, earned, strict=True))
            total += len(earned)
        kept[mode] = same / total
    assert abs(kept["balanced"] - kept["uniform"]) < 0.05, kept


def test_the_permutations_are_seeded():
    groups = _binary_groups(50)
    first = [RewardShuffle(3, "balanced").permute(i, g)[0] for i, g in enumerate(groups)]
    again = [RewardShuffle(3, "balanced").permute(i, g)[0] for i, g in enumerate(groups)]
    other = [RewardShuffle(4, "balanced").permute(i, g)[0] for i, g in enumerate(groups)]
    assert first == again and first != other


def _rollout(reward: float | None, cause: str, seed: int) -> Rollout:
    if cause == "infra_failure":
        return Rollout(cause=cause, error="sandbox died")
    outcome = RolloutOutcome(env_reward=reward, completion=[], trace=[], tool_call_count=1,
                             tool_failure_count=0, tool_calls_by_name={"bash": 1},
                             timed_out=False)
    return Rollout(cause=cause, trace=synthetic_trace(random.Random(seed)), outcome=outcome,
                   env_reward=reward, episode_id=f"e{seed}")


def test_a_balanced_group_pays_only_its_scored_rollouts_and_records_its_signal(tmp_path):
    rewards = [1.0, None, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    causes = ["ok", "infra_failure", "tampered", "ok", "ok", "ok", "ok", "ok"]
    results = [_rollout(r, c, i) for i, (r, c) in enumerate(zip(rewards, causes, strict=True))]
    shuffle = RewardShuffle(0, "balanced")
    g = prepare_group(results, group_index=5, reward_funcs=[], scale_rewards=True,
                      dispatch_version=0, shuffle=shuffle)
    assert g.rewards[1] is None and g.rewards[2] == 0.0  # unscorable; tampered keeps its 0
    moved = [0, 3, 4, 5, 6, 7]
    earned = [rewards[i] for i in moved]
    assert sorted(g.rewards[i] for i in moved) == sorted(earned)
    assert [g.per_rollout[i]["reward_unshuffled"] for i in moved] == earned
    assert g.shuffle_signal == pytest.approx(
        shuffle_signal(earned, [g.rewards[i] for i in moved]))
    assert shuffle.net_signal == pytest.approx(g.shuffle_signal)
    assert group_metrics([g], [])["reward/shuffle_signal"] == pytest.approx(g.shuffle_signal)
    append_group_records(tmp_path / "groups.jsonl", 1, [g])
    assert '"shuffle_signal"' in (tmp_path / "groups.jsonl").read_text()


def test_the_mode_reaches_the_trainer_from_the_command_line_and_a_bad_one_is_named():
    parser = build_parser("t", "d")
    default = settings_from_args(parser, ["--shuffle-rewards"]).trainer_config()
    assert default.shuffle_rewards and default.shuffle_mode == "balanced"
    uniform = settings_from_args(parser, ["--shuffle-rewards", "--shuffle-mode", "uniform"])
    assert uniform.trainer_config().shuffle_mode == "uniform"
    problems = AsyncGRPOConfig(shuffle_rewards=True, shuffle_mode="random").validate()  # type: ignore[arg-type]
    assert any("shuffle_mode='random'" in p and "balanced, uniform" in p for p in problems)
    with pytest.raises(ValueError, match="balanced, uniform"):
        RewardShuffle(0, "random")  # type: ignore[arg-type]
