"""The four agents with a thinking model: what each does with reasoning, and what the capture records.

    .venv/bin/python -m pytest tests/test_thinking_agents.py -q -s

Each agent CLI runs a one-command task against the scripted engine (harness/audit/scripted_engine.py)
serving the thinking model's template (models/tiny-qwen3-thinking) with its reasoning parser on:
the first reply is a think block and a shell call, the second a think block and the end. The
engine hands the reasoning to the proxy as vLLM 0.32 does (`reasoning`); the proxy gives it to
each agent in its dialect's form (chat `reasoning`, a Responses reasoning item, an Anthropic
thinking block). Checked for each agent:
  * the ids recorded are the engine's, exactly (prompt rendered by the real template, completion
    as the script's text encodes);
  * what the agent sends back on its second call (the engine request's assistant message), and
    what Qwen3's template then makes of it: all four send the reasoning back, it renders inside
    `<think>` (no user query since), so the second call extends the first (an agent that dropped
    it would make a rewritten-history row instead: tests/test_thinking_rows.py);
  * either way each sampled token is trained once (tests/helpers/rows_once.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.scripted_engine import ScriptedEngine, shell_call
from launchers.thinking_model import THINKING_MODEL
from tests.helpers.agent_cli import AGENT_RUNS, MINI_SUBMIT
from tests.helpers.rows_once import check_trained_once

pytestmark = [pytest.mark.agents, pytest.mark.slow]

COMMAND = "echo hello > hello.txt"
FINAL = "Done: hello.txt holds hello."
PLAN = "The task wants hello.txt; one echo writes it."
DONE_PLAN = "The file is written; say so."


def thinking_task(command: str, final: str | None = FINAL):
    """First call: think, then run `command`; second: think, then `final` (or, for mini-swe-agent,
    its submit command). A call without tools (a title) gets a plain title."""

    def script(request: dict[str, Any]) -> str:
        if not request.get("tools"):
            return "Hello file"
        step = sum(1 for m in request["messages"] if m.get("role") == "tool")
        if step == 0:
            return f"<think>\n{PLAN}\n</think>\n\n" + shell_call(request, command)
        if final is None:
            return f"<think>\n{DONE_PLAN}\n</think>\n\n" + shell_call(request, MINI_SUBMIT)
        return f"<think>\n{DONE_PLAN}\n</think>\n\n{final}"

    return script


@pytest.fixture
def scripted() -> Iterator[tuple[ScriptedEngine, Any]]:
    from capture import CaptureClient, CaptureServer

    with ScriptedEngine(THINKING_MODEL, thinking_task(COMMAND), reasoning_parser=True) as engine, \
            CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        yield engine, admin


def check(engine: ScriptedEngine, admin: Any, info: Any, work: Path, output: str) -> dict:
    """The shared checks; returns what the agent sent back and how the calls joined."""
    assert not engine.errors, f"the script failed: {engine.errors!r}\n{output}"
    assert (work / "hello.txt").is_file(), f"the agent did not run the command:\n{output}"
    trace = json.loads(admin.trace_json(info.session_id))
    turns = [t for t in trace["turns"] if not t["metadata"]["aux"]]
    assert len(turns) >= 2, output
    for turn in trace["turns"]:  # the engine's ids, exactly
        (request,) = [r for r in engine.requests if engine.prompt_ids(r) == turn["prompt_token_ids"]][-1:]
        reply = engine.replies[engine.requests.index(request)]
        assert turn["completion_token_ids"] == engine.completion_ids(reply)
    # the first reply's reasoning, as the engine gave it, is recorded in the chat-form response
    assert turns[0]["response"]["choices"][0]["message"]["reasoning"].strip() == PLAN
    second = [r for r in engine.requests if engine.prompt_ids(r) == turns[1]["prompt_token_ids"]][-1]
    sent_back = [m.get("reasoning") for m in second["messages"] if m["role"] == "assistant"]
    prompt_text = engine.tokenizer.decode(turns[1]["prompt_token_ids"])
    check_trained_once(trace)
    stats = admin.stats(info.session_id)
    found = {"sent_back": sent_back, "rendered": f"<think>\n{PLAN}\n</think>" in prompt_text,
             "join": turns[1]["metadata"]["join"], "joins": stats["joins"]}
    print(f"\n{turns[0]['metadata']['dialect']}: {found}")
    # Every agent sends the reasoning back (measured: opencode and mini-swe-agent as
    # `reasoning_content`, which the chat dialect renames; Codex as its reasoning item; Claude
    # Code as its thinking block), the engine gets it as `reasoning`, Qwen3's template renders it
    # (no user query since), and the second call extends the first token for token.
    assert found["sent_back"] == [f"\n{PLAN}\n"], found
    assert found["rendered"] and found["join"] == "extended", found
    return found




@pytest.mark.parametrize("agent", sorted(AGENT_RUNS))
def test_agent_with_a_thinking_model_records_engine_ids_and_trains_each_token_once(
        agent: str, scripted, tmp_path: Path) -> None:
    engine, admin = scripted
    if agent == "mini-swe-agent":
        engine.script = thinking_task(COMMAND, final=None)  # it stops on its submit command
    info, work, output = AGENT_RUNS[agent](admin, tmp_path)
    check(engine, admin, info, work, output)
