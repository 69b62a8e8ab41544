# .venv/bin/python -m pytest tests/test_session_limits.py -q
"""The session enforces the step limit for a CLI that has no step option (Codex), at the proxy.

Real sandbox and proxy, capture's fake engine, a shell-script agent (tests/helpers/sessions.py)
that would make five engine calls if nobody stopped it.
"""

from __future__ import annotations

from capture.fake_engine import FakeEngine
from harness.service.factory import HarborSessionFactory
from tests.helpers.sessions import CALL, HELLO, SOLVE, run_rollout, script_agent


def _rollout_without_step_knob(script: str, engine_url: str, *, max_steps: int):
    """One rollout of a shell-script agent with no step option of its own (as Codex)."""
    agent = script_agent(script, agent_name="no-step-knob")
    agent.NATIVE_STEP_LIMIT = False
    factory = HarborSessionFactory(None, split=[HELLO], harness=agent, llm_url=engine_url,
                                   max_steps=max_steps, agent_timeout_s=60, max_attempts=1)
    return run_rollout(factory, seed=0)


def test_an_agent_without_a_native_step_limit_is_stopped_after_max_steps_engine_calls():
    # Five calls 5 s apart, then a minute of nothing: left alone the agent runs > 80 s and hits
    # its 60 s timeout. The guard polls every 1 s and stops it once the proxy counted a 3rd call
    # (~10 s in), 5 s before a 4th could start: the engine sees at most 3 calls whatever the
    # machine's load, and the wall bound has ~15 s of margin on either side.
    with FakeEngine() as engine:  # its own: `requests` counts this rollout's calls only
        result = _rollout_without_step_knob(
            "; ".join([f"{CALL}; sleep 5"] * 5) + "; sleep 60", engine.url, max_steps=2)
        calls = len(engine.requests)
    # The identical requests are retries of one prompt to the proxy's graph, so the trace keeps
    # one turn: count the engine's calls, not turns.
    # Stopped at its step limit: `timed_out` (issue 15), its turns still trained; the cause is
    # the verifier's (unsolved: model_failure), not "timeout", which is the wall clock's.
    assert result.cause == "model_failure", result.error
    assert result.trace is not None and result.outcome is not None
    assert result.outcome.timed_out is True
    assert 2 <= calls <= 3, calls  # never the 4th
    assert result.timings["agent_run"] < 30.0


def test_the_last_allowed_call_keeps_its_reply_and_the_tools_it_asked_for_run():
    # Each reply takes ~3 s (24 tokens at 125 ms), longer than the guard's 1 s poll. With
    # max_steps=1 the agent's one call must finish, and what it does with the reply (here: solve
    # the task) must run; the guard stops it only when it starts a 2nd call. Stopping it at the
    # 1st call's start cut the reply: no turn, nothing solved (every 1-step Codex rollout).
    with FakeEngine(token_delay_s=0.125) as slow:
        result = _rollout_without_step_knob(f"{CALL}; {SOLVE}; {CALL}; sleep 60", slow.url,
                                            max_steps=1)
    assert result.cause == "ok", result.error  # stopped at its step limit, solved
    assert result.trace is not None and len(result.trace.turns) == 1
    assert result.env_reward == 1.0  # the step's action ran before the agent was stopped
    assert result.timings["agent_run"] < 30.0  # stopped at its 2nd call, not after its sleep
