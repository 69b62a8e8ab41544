"""Agents: black-box coding-agent CLIs pointed at one capture-proxy session each.

    name             class             dialect     step limit
    opencode         OpenCodeAgent     chat        opencode.json agent.build.steps (+ 1)
    claude-code      ClaudeCodeAgent   messages    --max-turns
    codex            CodexAgent        responses   none in the CLI: the session counts turns
    mini-swe-agent   MiniSweAgent      chat        agent.step_limit

Each is a Harbor `BaseAgent` (so a Harbor trial can load it by import path, e.g.
`harness.service.agents.opencode:OpenCodeAgent`) whose class only describes its CLI; the I/O lives once
in `harness.service.agents.base.HarnessAgent`.

Adding an agent is one small class
-----------------------------------
1. Create `harness/service/agents/<name>.py` with a subclass of `HarnessAgent` that sets
   `NAME` (registry key), `DIALECT` ("chat" | "responses" | "messages": the proxy route it calls),
   `CLI` (its `launchers.paths.agent_bin()` name, for the preinstalled local sandbox),
   `HARBOR_AGENT` ("module:Class" of Harbor's installed agent that installs it elsewhere) and
   `INSTALLED_BINARY` (its name on PATH after that install), plus a `name()` staticmethod.
2. Describe its configuration, using `self.endpoint_url` (the session's URL for its dialect),
   `self.api_key` (the session secret), `self.model_name`, `self.max_steps` and `self.home`
   (the sandbox's HOME):
     `config_files()`  -> {path relative to HOME: text}   (written chmod 600 before the run)
     `env()`           -> {VAR: value}                    (the agent process's environment)
     `command(instruction)` -> argv, starting with `*self.binary()`
   Never write outside HOME, never read the host's environment. If the CLI has no step-limit
   option, set `NATIVE_STEP_LIMIT = False` and the session stops it when it starts engine call
   max_steps + 1 (counted at the proxy); agents with a knob get a hard ceiling of 2 * max_steps
   + 4 calls. If the CLI has no option or a soft one (a model can act past it), set
   `PROXY_STEP_LIMIT = True`: the proxy refuses its model call that offers tools past max_steps.
3. Add it to `AGENTS` below. `tests/test_agents_config.py` checks every registered agent's
   config for the endpoint, the secret, HOME confinement and the step limit; add one
   end-to-end run to `tests/test_agents_e2e.py`.
"""

from __future__ import annotations

from harness.service.agents.base import Dialect, HarnessAgent
from harness.service.agents.claude_code import ClaudeCodeAgent
from harness.service.agents.codex import CodexAgent
from harness.service.agents.mini_swe_agent import MiniSweAgent
from harness.service.agents.opencode import OpenCodeAgent

__all__ = [
    "AGENTS",
    "ClaudeCodeAgent",
    "CodexAgent",
    "Dialect",
    "HarnessAgent",
    "MiniSweAgent",
    "OpenCodeAgent",
    "get_agent",
]

AGENTS: dict[str, type[HarnessAgent]] = {
    cls.NAME: cls for cls in (OpenCodeAgent, ClaudeCodeAgent, CodexAgent, MiniSweAgent)
}


def get_agent(name: str) -> type[HarnessAgent]:
    """The agent class registered as `name`; the error lists the known names."""
    try:
        return AGENTS[name]
    except KeyError:
        raise KeyError(
            f"unknown harness {name!r}; known: {', '.join(sorted(AGENTS))}. "
            "To add one, see the recipe in harness/service/agents/__init__.py."
        ) from None
