"""Each agent CLI run once against a capture session, on the host, with a throwaway HOME.

The launch lines of tests/test_capture_agents.py and of the thinking and compaction tests: a
temp HOME / XDG / CODEX_HOME / CLAUDE_CONFIG_DIR so no file of the host is read or written, each
agent's config pointing at the session's base URL for its dialect, a timeout. A missing agent is
a set-up defect (./setup.sh installs every one): it fails, never skips.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

__all__ = ["AGENT_RUNS", "MINI_SUBMIT", "TASK", "prepare_agent", "run_agent"]

AGENT_TIMEOUT_S = 300
TASK = "Create a file named hello.txt containing the word hello."
MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
POLICY = {"temperature": 1.0, "max_tokens": 256}


def _agent(name: str) -> Path:
    from launchers.paths import agent_bin

    try:
        return agent_bin(name)
    except Exception as exc:  # noqa: BLE001 - the message names ./setup.sh
        pytest.fail(f"{name} is not installed here: {exc}")


def prepare_agent(admin: Any, root: Path, name: str, config_dir: str):
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
                "XDG_CACHE_HOME": str(home / ".cache"), "NO_COLOR": "1", "CI": "1",
                "PWD": str(work), **env}
    process = subprocess.Popen(argv, cwd=work, env=full_env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=AGENT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        output += f"\n[test] the agent was killed after {AGENT_TIMEOUT_S} s".encode()
    return output.decode("utf-8", "replace")[-4000:]


def _opencode(admin: Any, tmp_path: Path) -> tuple[Any, Path, str]:
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
    path = home / ".config/opencode/opencode.json"
    path.write_text(json.dumps(config))
    output = run_agent([str(binary), "run", "-m", "capture/tiny", "--", TASK], home, work, {
        "OPENCODE_CONFIG": str(path), "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1", "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
        "OPENCODE_DISABLE_CLAUDE_CODE": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"})
    return info, work, output


def _claude(admin: Any, tmp_path: Path) -> tuple[Any, Path, str]:
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
    return info, work, output


def _codex(admin: Any, tmp_path: Path) -> tuple[Any, Path, str]:
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
    return info, work, output


def _mini(admin: Any, tmp_path: Path) -> tuple[Any, Path, str]:
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
    return info, work, output


# agent name -> run(admin, tmp_path) -> (session info, work dir, output tail)
AGENT_RUNS = {"opencode": _opencode, "claude-code": _claude, "codex": _codex,
              "mini-swe-agent": _mini}
