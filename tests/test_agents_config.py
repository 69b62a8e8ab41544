# .venv/bin/python -m pytest tests/test_agents_config.py -q
"""Every registered agent is pointed at its own session, inside its sandbox's HOME, with limits.

Config generation is checked per agent (endpoint, secret, step limit, HOME confinement), then
`setup()` writes the files into a real bubblewrap sandbox and we read them back from inside.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from pathlib import Path

import pytest

from harness.service.agents import AGENTS, HarnessAgent, get_agent

URL = "http://127.0.0.1:45678/s/sess123/v1"
SECRET = "secret-for-session-123"
HOME = "/root"


def _agent(cls: type[HarnessAgent], **kwargs) -> HarnessAgent:
    agent = cls(
        Path("/tmp/unused-logs"),
        model_name="tiny",
        base_url=URL,
        api_key=SECRET,
        max_steps=7,
        timeout_s=60,
        **kwargs,
    )
    agent.home = HOME
    return agent


def _everything(agent: HarnessAgent) -> str:
    """All the agent hands its CLI: files, environment and argv, as one string."""
    return json.dumps([agent.config_files(), agent.full_env(), agent.command("solve it")])


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_each_agent_declares_a_dialect_the_proxy_serves(name):
    assert AGENTS[name].DIALECT in {"chat", "responses", "messages"}
    assert AGENTS[name].name() == name


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_each_agent_hands_its_cli_the_session_url_and_secret(name):
    blob = _everything(_agent(AGENTS[name]))
    assert URL in blob
    assert SECRET in blob


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_secret_never_appears_on_the_command_line(name):
    # argv is visible to every process (ps); files are chmod 600 and env is per process.
    assert SECRET not in " ".join(_agent(AGENTS[name]).command("solve it"))


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_config_files_stay_inside_home(name):
    for relative in _agent(AGENTS[name]).config_files():
        assert not relative.startswith("/") and ".." not in Path(relative).parts


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_every_path_the_agent_environment_names_is_under_home(name):
    for key, value in _agent(AGENTS[name]).full_env().items():
        if value.startswith("/"):
            assert value == HOME or value.startswith(HOME + "/"), key


@pytest.mark.parametrize("name", sorted(n for n in AGENTS if AGENTS[n].NATIVE_STEP_LIMIT))
def test_agents_with_a_step_knob_get_the_step_limit(name):
    agent = _agent(AGENTS[name])
    blob = json.dumps([agent.config_files(), agent.command("x")])
    # opencode's last step is a text-only wrap-up, so it gets one step more to act in 7
    steps = 8 if name == "opencode" else 7
    assert (f'"{steps}"' in blob) or (f'": {steps}' in blob) or (f'step_limit\\": {steps}' in blob)


def test_opencode_provider_is_an_openai_compatible_one_at_the_session_url():
    files = _agent(get_agent("opencode")).config_files()
    config = json.loads(files[".config/opencode/opencode.json"])
    provider = config["provider"]["harness"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": URL, "apiKey": SECRET}
    assert config["agent"]["build"]["steps"] == 8  # 7 steps to act in, then its wrap-up
    assert (config["snapshot"], config["lsp"], config["formatter"]) == (False, False, False)


def test_codex_config_is_valid_toml_with_a_responses_provider_and_an_env_key():
    agent = _agent(get_agent("codex"))
    config = tomllib.loads(agent.config_files()[".codex/config.toml"])
    provider = config["model_providers"][config["model_provider"]]
    assert provider["wire_api"] == "responses" and provider["base_url"] == URL
    assert agent.full_env()[provider["env_key"]] == SECRET
    assert agent.full_env()["CODEX_HOME"] == f"{HOME}/.codex"


def test_claude_code_gets_the_anthropic_variables_and_sandbox_mode():
    env = _agent(get_agent("claude-code")).full_env()
    assert env["ANTHROPIC_BASE_URL"] == URL and env["ANTHROPIC_API_KEY"] == SECRET
    assert env["IS_SANDBOX"] == "1"
    command = _agent(get_agent("claude-code")).command("x")
    assert "--dangerously-skip-permissions" in command and "--disable-slash-commands" in command


def test_mini_swe_agent_gets_api_base_cost_tracking_off_and_its_config_dir_in_home():
    agent = _agent(get_agent("mini-swe-agent"))
    config = json.loads(agent.config_files()[".config/mini-swe-agent/harness.yaml"])
    assert config["model"]["model_kwargs"]["api_base"] == URL
    assert config["agent"]["step_limit"] == 7
    env = agent.full_env()
    assert env["MSWEA_COST_TRACKING"] == "ignore_errors" and env["MSWEA_CONFIGURED"] == "true"
    assert env["MSWEA_GLOBAL_CONFIG_DIR"].startswith(HOME + "/")
    assert "openai/tiny" in agent.command("x")


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_not_preinstalled_the_agent_runs_the_cli_harbor_installs_and_binds_nothing(name):
    agent = _agent(AGENTS[name], preinstalled=False)
    assert agent.command("x")[0] == AGENTS[name].INSTALLED_BINARY
    assert agent.host_paths() == []


def test_an_unknown_harness_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="mini-swe-agent"):
        get_agent("no-such-agent")


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_setup_writes_the_config_into_the_sandbox_home_private_to_the_sandbox(name, tmp_path):
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from harness.service.sandboxes.bwrap import BwrapEnvironment
    from harness.tasks import BUNDLED_DIR

    task = Task(BUNDLED_DIR / "hello-file")
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    agent = AGENTS[name](
        tmp_path / "logs",
        model_name="tiny",
        base_url=URL,
        api_key=SECRET,
        max_steps=7,
        timeout_s=60,
    )
    env = BwrapEnvironment(
        environment_dir=task.paths.environment_dir,
        environment_name="t",
        session_id=f"cfg-{name}",
        trial_paths=paths,
        task_env_config=task.config.environment,
        ro_binds={str(p): str(p) for p in agent.host_paths()},
    )

    async def run() -> tuple[str, str]:
        await env.start(force_build=False)
        try:
            await agent.setup(env)
            relative = next(iter(agent.config_files()))
            shown = await env.exec(
                f'stat -c %a "$HOME/{relative}" && cat "$HOME/{relative}"', env={"HOME": agent.home}
            )
            return agent.home, shown.stdout or ""
        finally:
            await env.stop(delete=True)

    home, shown = asyncio.run(run())
    assert home == "/root"  # the sandbox's own HOME: a private dir, not the host's /root
    mode, _, body = shown.partition("\n")
    assert mode == "600"
    assert body == next(iter(agent.config_files().values()))
    host_twin = Path.home() / next(iter(agent.config_files()))  # same path on the host
    assert not host_twin.exists() or SECRET not in host_twin.read_text(errors="ignore")


def test_a_context_window_is_told_to_each_agent_that_compacts_and_nothing_by_default():
    # opencode compacts at context - output = 16000 - 4000; Codex at 0.9 x 16000 = 14400;
    # Claude Code keeps its 100k minimum window and puts its threshold at 16000 / 80000 = 20%
    opencode = json.loads(_agent(get_agent("opencode"), context_window=16_000)
                          .config_files()[".config/opencode/opencode.json"])
    assert opencode["provider"]["harness"]["models"]["tiny"]["limit"] == {"context": 16_000,
                                                                         "output": 4_000}
    codex = tomllib.loads(_agent(get_agent("codex"), context_window=16_000)
                          .config_files()[".codex/config.toml"])
    assert (codex["model_context_window"], codex["model_auto_compact_token_limit"]) == (
        16_000, 14_400)
    claude = _agent(get_agent("claude-code"), context_window=16_000).full_env()
    assert claude["CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "100000"
    assert claude["CLAUDE_AUTOCOMPACT_PCT_OVERRIDE"] == "20.000"
    assert _agent(get_agent("claude-code"), context_window=150_000).full_env()[
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW"] == "150000"
    for name in AGENTS:  # unset: no agent is told anything about its window
        told = _everything(_agent(get_agent(name)))
        assert not any(knob in told for knob in (
            '"limit": {"context"', "model_context_window", "auto_compact", "AUTOCOMPACT",
            "AUTO_COMPACT")), name
    with pytest.raises(ValueError, match="context_window"):
        _agent(get_agent("opencode"), context_window=10)
