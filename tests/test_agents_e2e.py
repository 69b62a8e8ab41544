# .venv/bin/python -m pytest tests/test_agents_e2e.py -q
"""Each real agent CLI solves a bundled task end to end: bubblewrap sandbox -> capture proxy ->
scripted engine -> Harbor verifier -> validated TrainingTrace -> outcome.

The engine is scripted (harness/audit/scripted_engine.py: vLLM's wire shape and the tiny model's real
tokenizer, replies chosen here) so that every run is the same: the model writes the agent's shell
tool call that solves hello-file, the agent runs it in its sandbox, the model then says it is done
(mini-swe-agent: runs its submit command). What the tiny model would write is not the subject
here, and on a fresh build it is anyone's guess (issue 14); vLLM itself is tested in
test_foundation_engine.py, test_capture_engine.py and test_train_e2e.py. So these tests can ask
for the whole chain: cause "ok", reward 1.0, one tool call counted, the agent's turns chained.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from harness.audit.scripted_engine import ScriptedEngine, shell_call, shell_task
from harness.service.agents import AGENTS
from harness.service.factory import HarborSessionFactory
from harness.tasks import BUNDLED_DIR

pytestmark = [pytest.mark.agents, pytest.mark.slow]

SOLVE = "printf 'Hello, Harness!\\n' > /app/greeting.txt"
SUBMIT = {"mini-swe-agent": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}  # its way to stop
FINAL = "Done: /app/greeting.txt says hello."


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_agent_solves_a_bundled_task_to_a_trace_and_an_outcome(name, tiny_model_path: Path):
    commands = (SOLVE, SUBMIT[name]) if name in SUBMIT else (SOLVE,)
    with ScriptedEngine(tiny_model_path, shell_task(*commands, final=FINAL)) as engine:
        factory = HarborSessionFactory(
            None,
            split=[BUNDLED_DIR / "hello-file"],
            harness=name,
            llm_url=engine.url,
            model=engine.model,
            sampling={"temperature": 1.0},
            max_tokens=256,
            max_steps=4,
            agent_timeout_s=300,
            max_attempts=1,
        )
        try:
            result = asyncio.run(factory.rollout(seed=0))
        finally:
            factory.close()

    assert not engine.errors, engine.errors
    assert (result.cause, result.env_reward) == ("ok", 1.0), (result.cause, result.error)
    assert result.attempts == 1
    trace = result.trace
    assert trace is not None  # a TrainingTrace: every turn's ids, logprobs and mask validated
    assert {t.metadata["dialect"] for t in trace.turns} == {AGENTS[name].DIALECT}
    assert all(t.metadata["sampling"] for t in trace.turns)  # the session's policy was enforced
    # every call is the agent's own: none is unplaced (capture.placement), so all of it trains
    assert not [t.node_id for t in trace.turns if t.metadata["unplaced"]]
    agent_turns = [t for t in trace.turns if not t.metadata["aux"]]
    assert len(agent_turns) == len(commands) + (0 if name in SUBMIT else 1), \
        [t.metadata["finish_reason"] for t in agent_turns]
    # each agent turn continued the one before: the history came back token for token
    for earlier, later in zip(agent_turns, agent_turns[1:], strict=False):
        assert later.metadata["parent_id"] == earlier.node_id
    outcome = result.outcome
    assert outcome is not None and len(outcome.trace) == len(trace.turns)
    assert outcome.env_reward == result.env_reward == 1.0
    assert outcome.tool_call_count == sum(outcome.tool_calls_by_name.values()) == len(commands)
    assert outcome.completion and outcome.completion[-1]["role"] == "assistant"


UNDO = "rm -f /app/greeting.txt"


def _one_step_rollout(name: str, script, tiny_model_path: Path):
    """One max_steps=1 rollout of the `name` agent on hello-file, its model scripted."""
    with ScriptedEngine(tiny_model_path, script) as engine:
        factory = HarborSessionFactory(
            None, split=[BUNDLED_DIR / "hello-file"], harness=name, llm_url=engine.url,
            model=engine.model, sampling={"temperature": 1.0}, max_tokens=256, max_steps=1,
            agent_timeout_s=300, max_attempts=1)
        try:
            result = asyncio.run(factory.rollout(seed=0))
        finally:
            factory.close()
    assert not engine.errors, engine.errors
    return result


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_a_one_step_rollout_acts_in_its_one_step_and_never_after(name, tiny_model_path: Path):
    """The family tasks run at max_steps=1. The agent's first turn must be an ordinary one that
    offers its tools and runs the call it gets: opencode's `steps` of 1 made it its text-only
    wrap-up ("MAXIMUM STEPS REACHED ... Do NOT make any tool calls"), so every opencode rollout
    of the main command was told not to do the task it was graded on. And a policy that acts
    again after its one step (here: undoes its work) must not be served: opencode runs the tools
    of its wrap-up turn, and a poll stopping the agent comes after the reply."""
    requests: list[dict] = []

    def script(request: dict) -> str:
        requests.append(request)
        if not request.get("tools"):
            return "A title"
        acted = sum(1 for r in requests if r.get("tools")) > 1
        return shell_call(request, UNDO if acted else SOLVE)

    result = _one_step_rollout(name, script, tiny_model_path)
    acting = [r for r in requests if r.get("tools")]
    first = acting[0]  # the first call that offered tools: no aux call
    assert not [m for m in first["messages"] if m.get("role") == "assistant"], first["messages"]
    assert "MAXIMUM STEPS" not in json.dumps(first["messages"])
    assert len(acting) == 1, [r["messages"][-1] for r in acting]  # no 2nd step reached the engine
    assert result.env_reward == 1.0, (result.cause, result.error)  # its one call ran, alone
    assert result.outcome is not None and result.outcome.timed_out  # and it had no step left
    assert result.outcome.tool_call_count == 1


def test_claude_code_runs_without_skills_so_its_instruction_ends_the_prompt(tiny_model_path: Path):
    """Claude Code sends the instruction, then ~3.4k tokens of reminders, most of them its skill
    listing (dataviz, keybindings-help, ...: features of its own product, which a sandboxed task
    has no use for). A small policy names files after words in that listing. The agent runs with
    `--disable-slash-commands`: no Skill tool and no listing, the tail after the instruction
    ~1k tokens."""
    requests: list[dict] = []

    def script(request: dict) -> str:
        requests.append(request)
        return shell_call(request, SOLVE) if request.get("tools") else "A title"

    result = _one_step_rollout("claude-code", script, tiny_model_path)
    first = next(r for r in requests if r.get("tools"))
    names = {t["function"]["name"] for t in first["tools"]}
    assert "Bash" in names and "Skill" not in names, sorted(names)
    assert "skills are available" not in json.dumps(first["messages"])
    assert result.env_reward == 1.0, (result.cause, result.error)
