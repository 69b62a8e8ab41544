"""Example reward functions for `python -m harness.train --reward-fn ...` and the Python API.

A reward function receives the rollout's `HarnessRolloutOutcome` and returns a float, or None
when the rollout cannot be scored (it is then left out of its group's baseline, never counted as
0). The outcome carries:

    env_reward            the task verifier's reward (float, or None when unscored)
    completion            the final transcript (list of chat messages)
    trace                 the captured engine turns (OpenEnv TraceEntry dicts)
    tool_call_count       tool calls the agent made
    tool_failure_count    tool results that failed (the agent's own flag, else error-like text)
    tool_calls_by_name    {tool name: calls}
    timed_out             the agent hit its time or step limit

From the command line (a module path, or a file path, then the function name):

    python -m harness.train --harness mini-swe-agent --reward-fn examples.reward_fns:shaped_reward
    python -m harness.train --reward-funcs pass=examples.reward_fns:env_or_none \\
                            --reward-funcs tools=examples.reward_fns:tool_discipline*0.1

From Python:

    from trainer import HarnessAsyncGRPOTrainer, RewardFunc
    from examples.reward_fns import shaped_reward, tool_discipline
    HarnessAsyncGRPOTrainer(..., rollout_reward_fn=shaped_reward,
                            reward_funcs=[RewardFunc("tools", tool_discipline, 0.1)])

A function that raises or returns a non-number is reported by its name and the rollout counts as
a reward failure (unscorable); the run goes on.
"""

from __future__ import annotations

from typing import Any


def env_or_none(outcome: Any) -> float | None:
    """The verifier's reward as is (what the trainer uses when no function is given)."""
    return outcome.env_reward


def shaped_reward(outcome: Any) -> float | None:
    """The verifier's reward, plus small format bonuses, minus a penalty for timeouts.

    +0.1 for calling a tool at all (a format reward: the agent's loop only moves through tool
    calls) and +0.1 more when none of its calls failed; -0.5 when it hit its time or step limit.
    Unscored stays unscored: shaping must not turn a rollout the verifier could not grade into a
    number.
    """
    if outcome.env_reward is None:
        return None
    called = outcome.tool_call_count > 0
    bonus = (0.1 if called else 0.0) + (0.1 if called and outcome.tool_failure_count == 0 else 0.0)
    penalty = 0.5 if outcome.timed_out else 0.0
    return float(outcome.env_reward) + bonus - penalty


def tool_discipline(outcome: Any) -> float:
    """Fraction of tool calls that did not fail; 0 when the agent never called a tool."""
    if outcome.tool_call_count == 0:
        return 0.0
    return 1.0 - outcome.tool_failure_count / outcome.tool_call_count
