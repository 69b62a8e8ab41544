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
from tests.helpers.agent_cli import prepare_agent, run_agent
from tests.helpers.prefix_oracle import turn_parent

pytestmark = [pytest.mark.agents, pytest.mark.slow]

TASK = "Create a file named hello.txt containing the word hello."
MARK = "wrote-hello"  # what the command prints: it must come back to the engine as a tool result
COMMAND = f"echo hello > hello.txt && echo {MARK}"
FINAL = "Done: hello.txt holds hello."
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


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
    binary, info, home, work = prepare_agent(admin, tmp_path, "opencode", ".config/opencode")
    config = {
        "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
        "model": "capture/tiny", "small_model": "capture/tiny",
        "provider": {"capture": {"npm": "@ai-sdk/openai-compatible", "name": "capture",
                                 "options": {"baseURL": info.base_urls["chat"],
                                             "apiKey": info.secret},
                                 "models": {"tiny": {"name": "tiny"}}}},
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }
    config_path = home / ".config/opencode/opencode.json"
    config_path.write_text(json.dumps(config))
    output = run_agent([str(binary), "run", "-m", "capture/tiny", "--", TASK], home, work, {
        "OPENCODE_CONFIG": str(config_path), "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"})
    turns = check_capture(engine, admin, info, work, output, "chat")
    assert all(t["metadata"]["stream"] for t in turns)
    reasons = [t["metadata"]["aux_reason"] for t in turns]
    assert "title_generator" in reasons, reasons
    assert FINAL in output, output


def test_claude_code_streaming_messages_are_captured(scripted, tmp_path):
    engine, admin = scripted
    binary, info, home, work = prepare_agent(admin, tmp_path, "claude", ".claude")
    (home / ".claude/.claude.json").write_text('{"hasCompletedOnboarding": true}\n')
    env = {"ANTHROPIC_BASE_URL": info.base_urls["messages"], "ANTHROPIC_API_KEY": info.secret,
           "CLAUDE_CONFIG_DIR": str(home / ".claude"), "IS_SANDBOX": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
           "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1"}
    for var in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_SONNET_MODEL",
                "ANTHROPIC_DEFAULT_OPUS_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                "CLAUDE_CODE_SUBAGENT_MODEL"):
        env[var] = "tiny"
    output = run_agent([str(binary), "-p", TASK, "--dangerously-skip-permissions",
                        "--max-turns", "3", "--model", "tiny"], home, work, env)
    turns = check_capture(engine, admin, info, work, output, "messages")
    assert all(t["metadata"]["stream"] for t in turns if not t["metadata"]["aux"])
    assert FINAL in output, output


def test_codex_streaming_responses_are_captured(scripted, tmp_path):
    engine, admin = scripted
    binary, info, home, work = prepare_agent(admin, tmp_path, "codex", ".codex")
    (home / ".codex/config.toml").write_text("\n".join([
        'model = "tiny"', 'model_provider = "capture"', 'approval_policy = "never"',
        'sandbox_mode = "danger-full-access"', "check_for_update_on_startup = false", "",
        "[model_providers.capture]", 'name = "capture"',
        f"base_url = {json.dumps(info.base_urls['responses'])}",
        'env_key = "CAPTURE_KEY"', 'wire_api = "responses"', "request_max_retries = 1",
        "stream_max_retries = 1", ""]))
    output = run_agent([str(binary), "exec", "--skip-git-repo-check",
                        "--dangerously-bypass-approvals-and-sandbox", "-m", "tiny", "--", TASK],
                       home, work, {"CAPTURE_KEY": info.secret, "CODEX_HOME": str(home / ".codex")})
    turns = check_capture(engine, admin, info, work, output, "responses")
    assert all(t["metadata"]["stream"] for t in turns)
    assert FINAL in output, output


def test_mini_swe_agent_non_streaming_chat_is_captured(scripted, tmp_path):
    engine, admin = scripted
    engine.script = shell_task(COMMAND, MINI_SUBMIT)  # it stops on its submit command's output
    binary, info, home, work = prepare_agent(admin, tmp_path, "mini", ".config/mini-swe-agent")
    config_path = home / ".config/mini-swe-agent/capture.yaml"
    config_path.write_text(json.dumps({
        "model": {"model_kwargs": {"api_base": info.base_urls["chat"], "api_key": info.secret,
                                   "drop_params": True}},
        "agent": {"step_limit": 3, "cost_limit": 0}}))
    output = run_agent([str(binary), "-m", "openai/tiny", "-t", TASK, "--yolo",
                        "--exit-immediately", "-c", "mini.yaml", "-c", str(config_path),
                        "-o", str(home / "trajectory.json")], home, work, {
        "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1", "MSWEA_GLOBAL_CONFIG_DIR": str(home / ".config/mini-swe-agent"),
        "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    turns = check_capture(engine, admin, info, work, output, "chat")
    assert not any(t["metadata"]["stream"] for t in turns)
    assert all(not t["metadata"]["aux"] for t in turns)  # one bash tool on every call
    # It stopped on the submit command, which the model wrote on its second turn.
    assert engine.replies[-1] == tool_call("bash", command=MINI_SUBMIT), engine.replies
    trajectory = json.loads((home / "trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted", trajectory["info"]
