"""Rewards, groups, config and the session seam: every failure counted by cause, none hidden.

Run: .venv/bin/python -m pytest tests/test_trainer_rewards.py -q
"""

from __future__ import annotations

import asyncio
import random

import pytest

from trainer.config import AsyncGRPOConfig
from trainer.errors import CaptureError, ConfigError, RolloutSourceError
from trainer.fakes import synthetic_trace
from trainer.groups import group_metrics, prepare_group
from trainer.rewards import RewardFunc, normalize_reward_funcs, score_rollout
from trainer.rollouts import Rollout, RolloutOutcome, SessionDriver, as_rollout_source


def _outcome(env: float | None = 1.0, calls: int = 2) -> RolloutOutcome:
    return RolloutOutcome(env_reward=env, completion=[], trace=[], tool_call_count=calls,
                          tool_failure_count=1, tool_calls_by_name={"bash": calls},
                          timed_out=False)


def _rollout(reward: float | None, cause: str = "ok", seed: int = 0) -> Rollout:
    return Rollout(cause=cause, trace=synthetic_trace(random.Random(seed)),
                   outcome=_outcome(reward), env_reward=reward, episode_id=f"e{seed}")


def test_without_reward_functions_the_verifier_env_reward_is_the_reward():
    assert score_rollout(_outcome(0.25), 0.25, []).total == 0.25


def test_named_reward_functions_are_weighted_and_each_reported():
    funcs = normalize_reward_funcs(lambda o: o.env_reward,
                                   [RewardFunc("brevity", lambda o: -0.1 * o.tool_call_count, 2.0)])
    result = score_rollout(_outcome(1.0, calls=3), 1.0, funcs)
    assert result.total == pytest.approx(1.0 + 2.0 * -0.3)
    assert result.parts == {"<lambda>": 1.0, "brevity": pytest.approx(-0.3)}


@pytest.mark.parametrize("bad", [lambda o: 1 / 0, lambda o: "1.0", lambda o: float("nan"),
                                 lambda o: True])
def test_a_reward_function_that_raises_or_returns_a_non_number_is_a_named_failure(bad):
    funcs = [RewardFunc("shaky", bad)]
    result = score_rollout(_outcome(), 1.0, funcs)
    assert result.total is None and result.failure.startswith("shaky:")


def test_a_reward_failure_is_counted_and_leaves_the_baseline():
    funcs = [RewardFunc("r", lambda o: 1 / 0 if o.env_reward == 0.5 else o.env_reward)]
    g = prepare_group([_rollout(1.0, seed=1), _rollout(0.5, seed=2), _rollout(0.0, seed=3)],
                      group_index=0, reward_funcs=funcs, scale_rewards=False, dispatch_version=0)
    assert g.causes["reward_failure"] == 1 and g.reward_failures[0].startswith("r:")
    assert g.rewards == [1.0, None, 0.0]
    assert group_metrics([g], ["r"])["rewards/r/failures"] == 1
    assert sorted(set(g.row_advantages)) == [-0.5, 0.5]  # baseline over {1, 0} only


def test_infra_and_verifier_failures_are_excluded_from_the_baseline_and_counted_by_cause():
    results = [_rollout(1.0, seed=1), _rollout(0.0, seed=2),
               Rollout(cause="infra_failure", error="sandbox died"),
               Rollout(cause="verifier_failure", error="test.sh crashed")]
    g = prepare_group(results, group_index=3, reward_funcs=[], scale_rewards=False,
                      dispatch_version=0)
    assert g.rewards == [1.0, 0.0, None, None]
    m = group_metrics([g], [])
    assert m["rollouts/cause/infra_failure"] == 1 and m["rollouts/cause/verifier_failure"] == 1
    assert m["rollouts/cause/ok"] == 2


def test_rollouts_cut_short_at_their_step_limit_are_not_counted_as_timeouts():
    # A 2-step task's rollouts end at the step limit with outcome.timed_out set (TRL's field
    # tells a reward function it was cut short); only the cause says it ran out of time.
    short = _rollout(1.0, seed=1)
    short.outcome.timed_out = True
    late = _rollout(0.0, cause="timeout", seed=2)
    late.outcome.timed_out = True
    g = prepare_group([short, late, _rollout(0.0, seed=3)], group_index=0, reward_funcs=[],
                      scale_rewards=False, dispatch_version=0)
    m = group_metrics([g], [])
    assert m["rollouts/cut_short"] == 2 and m["rollouts/cause/timeout"] == 1
    assert "rollouts/timed_out" not in m


def test_a_zero_variance_group_is_skipped_before_any_row_is_built():
    bad_trace = {"turns": [{"node_id": "x"}]}  # would raise CaptureError if it were ever read
    results = [Rollout(cause="ok", trace=bad_trace, outcome=_outcome(1.0), env_reward=1.0)] * 3
    g = prepare_group(results, group_index=0, reward_funcs=[], scale_rewards=True,
                      dispatch_version=0)
    assert g.skipped == "zero_variance" and g.rows == []
    assert group_metrics([g], [])["groups/skipped/zero_variance"] == 1


def test_the_seed_metric_names_are_reported():
    g = prepare_group([_rollout(1.0, seed=1), _rollout(0.0, seed=2)], group_index=0,
                      reward_funcs=normalize_reward_funcs(lambda o: o.env_reward, None),
                      scale_rewards=True, dispatch_version=0)
    m = group_metrics([g], ["<lambda>"])
    assert m["rewards/<lambda>/mean"] == 0.5 and m["rollout/correctness_mean"] == 0.5
    assert m["tools/call_frequency"] == 2.0 and m["tools/failure_frequency"] == 0.5


def test_config_validate_reports_every_problem_at_once():
    cfg = AsyncGRPOConfig(num_generations=1, temperature=0.0, is_cap=1.1, staleness_rule="skip",
                          report_to="tensorboard", max_staleness=-1)
    problems = cfg.validate()
    for field in ("num_generations", "temperature", "is_cap", "staleness_rule", "report_to",
                  "max_staleness"):
        assert any(p.startswith(field) for p in problems), field
    with pytest.raises(ConfigError) as err:
        cfg.check()
    assert len(err.value.problems) == len(problems) == 6


def test_the_default_config_is_valid_and_pins_a_full_vocabulary_sampling_policy():
    cfg = AsyncGRPOConfig(temperature=0.7, max_tokens=256, seed=5)
    assert cfg.validate() == []
    assert cfg.sampling() == {"temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
                              "frequency_penalty": 0.0, "presence_penalty": 0.0,
                              "repetition_penalty": 1.0, "seed": 5, "max_tokens": 256}


def test_the_factory_is_called_with_the_trainers_sampling_policy():
    seen = {}

    class Source:
        async def rollout(self, task=None, seed=None, episode_id=None):
            return None

    def factory(*, sampling):
        seen.update(sampling)
        return Source()

    as_rollout_source(factory, {"temperature": 0.5}, max_concurrent=1)
    assert seen == {"temperature": 0.5}


def test_a_factory_instance_is_refused_because_its_sampling_cannot_be_pinned():
    with pytest.raises(RolloutSourceError, match="partial"):
        as_rollout_source(SessionDriver(object(), max_concurrent=1), {}, max_concurrent=1)


class _Session:
    def __init__(self, mode: str):
        self.mode, self.closed = mode, False

    def wait_for_completion(self, timeout_s=None):
        if self.mode == "timeout":
            raise TimeoutError
        return 1 if self.mode == "crash" else 0

    def fetch_training_trace(self):
        if self.mode == "transport":
            raise ConnectionError("proxy unreachable")
        if self.mode == "malformed":
            raise ValueError("invalid training turn: logprob_misalign")
        return synthetic_trace(random.Random(0))

    def verify(self, completion):
        if self.mode == "verifier":
            raise RuntimeError("test.sh crashed")
        return type("V", (), {"env_reward": 1.0})()

    def close(self):
        self.closed = True


class _Factory:
    def __init__(self, mode):
        self.mode, self.sessions = mode, []

    def create(self, task, seed=None, episode_id=None):
        if self.mode == "create":
            raise OSError("no sandbox")
        self.sessions.append(_Session(self.mode))
        return self.sessions[-1]


@pytest.mark.parametrize(("mode", "cause"), [
    ("ok", "ok"), ("timeout", "timeout"), ("crash", "model_failure"),
    ("create", "infra_failure"), ("transport", "infra_failure"),
    ("verifier", "verifier_failure"),
])
def test_the_session_driver_sorts_every_failure_into_a_cause_and_closes_the_session(mode, cause):
    factory = _Factory(mode)
    r = asyncio.run(SessionDriver(factory, max_concurrent=1).rollout(seed=4))
    assert r.cause == cause
    assert all(s.closed for s in factory.sessions)
    if cause in ("ok", "timeout", "model_failure"):
        assert r.trace is not None and r.outcome.timed_out == (mode == "timeout")


def test_a_malformed_trace_from_a_session_stops_training_with_capture_error():
    with pytest.raises(CaptureError, match="logprob_misalign"):
        asyncio.run(SessionDriver(_Factory("malformed"), max_concurrent=1).rollout(seed=0))
