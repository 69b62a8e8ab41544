"""Real agent CLIs against the capture proxy in front of a scripted engine.

opencode (streaming chat), Claude Code (streaming messages), Codex (streaming responses) and
mini-swe-agent (non-streaming chat) each run on the host (no sandbox) in a temp dir, with a temp
HOME / XDG / CODEX_HOME / CLAUDE_CONFIG_DIR so no file of the host is read or written, with their
own system prompts and tools, pointed at a fresh capture session, under a timeout.

The model is scripted (harness/audit/scripted_engine.py: vLLM's wire shape, the tiny model's real
tokenizer and chat template, replies chosen here), because what is tested is the capture and each
agent's dialect, not what a 2-layer model happens to sample: on a freshly built tiny model the
agents' real prompts got no clean tool call at all (issue 14). The script plays one task:

    call with the agent's shell tool, no tool result yet  ->  a hermes call of that tool running
                                                              `echo hello > hello.txt && echo ...`
    call with the shell tool, after the tool result       ->  a final text (mini-swe-agent: its
                                                              submit command, its way to stop)
    call without tools (titles, probes, side calls)       ->  a short title

What is checked, for every agent:

  * every call succeeded upstream and the trace validates with OpenEnv's own TrainingTrace;
  * every turn's parent is what a brute-force longest-prefix oracle says;
  * the agent ran the model's tool call (hello.txt holds "hello"), its output came back to the
    engine as a tool result, and the agent's second turn extends the first: the engine's rendering
    of the history the agent sent back starts with the exact tokens of the first call's prompt and
    completion. This is what fails if a dialect's round trip changes a tool call's name or what
    its arguments say (a translation that adds a key to Claude Code's tool input breaks the chain);
  * each turn's completion ids, logprobs and loss mask are the engine's (aux calls: all-zero mask),
    and aux calls are tagged (opencode's title generator, Claude Code's side calls).

Run: .venv/bin/python -m pytest tests/test_capture_agents.py -q -s
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.scripted_engine import ScriptedEngine, scripted_logprob, shell_task, tool_call
from tests.helpers.agent_cli import AGENT_RUNS, MINI_SUBMIT
from tests.helpers.prefix_oracle import turn_parent

pytestmark = [pytest.mark.agents, pytest.mark.slow]

MARK = "wrote-hello"  # what the command prints: it must come back to the engine as a tool result
COMMAND = f"echo hello > hello.txt && echo {MARK}"
FINAL = "Done: hello.txt holds hello."


@pytest.fixture
def scripted(tiny_model_path: Path) -> Iterator[tuple[ScriptedEngine, Any]]:
    """A scripted engine playing the task (module docstring; a test may swap `engine.script`),
    a capture proxy in front of it, and the proxy's admin client."""
    from capture import CaptureClient, CaptureServer

    script = shell_task(COMMAND, final=FINAL, title="Hello file")
    with ScriptedEngine(tiny_model_path, script) as engine, \
            CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        yield engine, admin


def engine_request(engine: ScriptedEngine, turn: dict[str, Any]) -> dict[str, Any]:
    """The chat request the engine answered with this turn's prompt (matched by prompt ids:
    concurrent calls, such as opencode's title call, may reach the engine in either order)."""
    matches = [r for r in engine.requests if engine.prompt_ids(r) == turn["prompt_token_ids"]]
    assert matches, f"turn {turn['node_id']}: no engine request rendered to its prompt ids"
    return matches[-1]


def check_capture(engine: ScriptedEngine, admin: Any, info: Any, work: Path, output: str,
                  dialect: str, n_agent_turns: int = 2) -> list[dict[str, Any]]:
    """The assertions every agent shares (module docstring); returns the turns."""
    from openenv.core.harness.training import TrainingTrace

    stats = admin.stats(info.session_id)
    summary = {k: stats[k] for k in ("n_calls", "n_ok", "failed", "aux", "discarded", "graph")}
    print(f"\n{dialect}: stats {json.dumps(summary)}\n{dialect}: replies {engine.replies}")
    assert not engine.errors, f"the script failed: {engine.errors!r}\n{output}"
    assert stats["n_ok"] > 0, f"the agent never completed a call through the proxy:\n{output}"
    assert stats["n_ok"] == stats["n_calls"], f"calls failed: {stats}\n{output}"
    # a call sent ahead of its translation (capture/early.py) was always what the translation wrote
    assert stats["early"]["mismatched"] == 0, stats["early"]
    raw = admin.trace_json(info.session_id)
    trace = TrainingTrace.model_validate_json(raw)
    turns = json.loads(raw)["turns"]
    assert len(trace.turns) == len(turns) == stats["n_ok"]
    for i, turn in enumerate(turns):
        assert turn["metadata"]["dialect"] == dialect
        # parents are exactly the longest token-prefix predecessors (retries excluded already)
        assert turn["metadata"]["parent_id"] == turn_parent(turn, turns[:i]), i
        # the engine's ids and logprobs, unchanged; the loss on the completion of agent turns only
        request = engine_request(engine, turn)
        reply = engine.replies[engine.requests.index(request)]
        cap = request.get("max_completion_tokens") or request.get("max_tokens")
        completion = engine.completion_ids(reply)[:cap]
        assert turn["completion_token_ids"] == completion, turn["node_id"]
        n_prompt, n_completion = len(turn["prompt_token_ids"]), len(completion)
        expected_logps = [scripted_logprob(k) for k in range(n_completion)]
        assert turn["per_token_logps"] == expected_logps, turn["node_id"]
        trained = 0 if turn["metadata"]["aux"] else 1
        assert turn["loss_mask"] == [0] * n_prompt + [trained] * n_completion, turn["node_id"]

    agent_turns = [t for t in turns if not t["metadata"]["aux"]]
    print(f"{dialect}: {len(turns)} turns, {len(agent_turns)} agent turns, aux "
          f"{[t['metadata']['aux_reason'] for t in turns if t['metadata']['aux']]}")
    assert len(agent_turns) == n_agent_turns, (
        f"expected {n_agent_turns} agent turns (tool call, then the end): "
        f"{[t['metadata']['finish_reason'] for t in agent_turns]}\n{output}")
    # The agent ran the call the model wrote...
    assert (work / "hello.txt").is_file(), f"the agent did not run `{COMMAND}`:\n{output}"
    assert (work / "hello.txt").read_text() == "hello\n"
    # ...sent its output back as a tool result...
    second = engine_request(engine, agent_turns[1])
    results = [m for m in second["messages"] if m.get("role") == "tool"]
    assert any(MARK in json.dumps(m.get("content")) for m in results), results
    # ...and the history it sent back extends the first call token for token.
    first = agent_turns[0]
    prefix = first["prompt_token_ids"] + first["completion_token_ids"]
    assert agent_turns[1]["prompt_token_ids"][: len(prefix)] == prefix, (
        "the agent's second prompt does not extend its first prompt + completion")
    for later, earlier in zip(agent_turns[1:], agent_turns, strict=False):
        assert later["metadata"]["parent_id"] == earlier["node_id"]
    return turns


def test_opencode_streaming_chat_is_captured_with_its_title_call_tagged(scripted, tmp_path):
    engine, admin = scripted
    info, work, output = AGENT_RUNS["opencode"](admin, tmp_path)
    turns = check_capture(engine, admin, info, work, output, "chat")
    assert all(t["metadata"]["stream"] for t in turns)
    reasons = [t["metadata"]["aux_reason"] for t in turns]
    assert "title_generator" in reasons, reasons
    assert FINAL in output, output


def test_claude_code_streaming_messages_are_captured(scripted, tmp_path):
    engine, admin = scripted
    info, work, output = AGENT_RUNS["claude-code"](admin, tmp_path)
    turns = check_capture(engine, admin, info, work, output, "messages")
    assert all(t["metadata"]["stream"] for t in turns if not t["metadata"]["aux"])
    assert FINAL in output, output


def test_codex_streaming_responses_are_captured(scripted, tmp_path):
    engine, admin = scripted
    info, work, output = AGENT_RUNS["codex"](admin, tmp_path)
    turns = check_capture(engine, admin, info, work, output, "responses")
    assert all(t["metadata"]["stream"] for t in turns)
    assert FINAL in output, output


def test_mini_swe_agent_non_streaming_chat_is_captured(scripted, tmp_path):
    engine, admin = scripted
    engine.script = shell_task(COMMAND, MINI_SUBMIT)  # it stops on its submit command's output
    info, work, output = AGENT_RUNS["mini-swe-agent"](admin, tmp_path)
    turns = check_capture(engine, admin, info, work, output, "chat")
    assert not any(t["metadata"]["stream"] for t in turns)
    assert all(not t["metadata"]["aux"] for t in turns)  # one bash tool on every call
    # It stopped on the submit command, which the model wrote on its second turn.
    assert engine.replies[-1] == tool_call("bash", command=MINI_SUBMIT), engine.replies
    trajectory = json.loads((tmp_path / "home" / "trajectory.json").read_text())  # AGENT_RUNS' -o
    assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]
