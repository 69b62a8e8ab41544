"""mini-swe-agent (PyPI `mini-swe-agent`, 2.4 here): non-streaming chat completions, one bash tool.

Wire facts (DESIGN.md section 5): `mini -m openai/<model> -c model.model_kwargs.api_base=.../v1`
with `MSWEA_COST_TRACKING=ignore_errors` (the tiny model has no price) and
`MSWEA_CONFIGURED=true` (no first-run wizard). Its global config dir (where it would write a
`.env`) is redirected by `MSWEA_GLOBAL_CONFIG_DIR` into the sandbox HOME. The secret goes into a
YAML config file under HOME rather than onto the command line, where `ps` would show it.
Step limit: `agent.step_limit`; `--exit-immediately` so it never waits for a confirmation.

Its model client is `harness_mswea_model.ChatCompletionsModel` (agents/in_sandbox/), loaded
through mini-swe-agent's public `model.model_class` setting from a copy written under HOME like
the config: the same request bodies as its default litellm client (tested turn by turn), without
litellm's 6-8 s of import CPU at every start, most of a tiny-model rollout's cost on a CPU.

Preinstalled, it runs as `<mswea venv>/bin/python -m minisweagent.run.mini`: the venv's console
scripts carry an absolute shebang that breaks when the cache is moved; the interpreter does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

from harness.service.agents.base import Dialect, HarnessAgent

__all__ = ["MiniSweAgent"]

_CONFIG = ".config/mini-swe-agent/harness.yaml"
_PLUGIN_DIR = ".config/mini-swe-agent/harness-plugin"
_PLUGIN = Path(__file__).with_name("in_sandbox") / "harness_mswea_model.py"


class MiniSweAgent(HarnessAgent):
    NAME: ClassVar[str] = "mini-swe-agent"
    DIALECT: ClassVar[Dialect] = "chat"
    CLI: ClassVar[str] = "mini"
    HARBOR_AGENT: ClassVar[str] = "harbor.agents.installed.mini_swe_agent:MiniSweAgent"
    INSTALLED_BINARY: ClassVar[str] = "mini-swe-agent"
    # "litellm": mini-swe-agent's own default client (bench/rollouts measures both).
    MODEL_CLIENT: ClassVar[Literal["direct", "litellm"]] = "direct"

    @staticmethod
    def name() -> str:
        return MiniSweAgent.NAME

    def _venv(self) -> Path:
        from launchers.paths import agent_bin

        # <venv>/bin/mini -> <venv>, with the venv dir itself resolved (.mswea-venv is a link
        # into the cache, and only the cache path is bound into the sandbox). The script is not
        # resolved: the venv's python is itself a symlink to the base interpreter.
        return agent_bin(self.CLI).absolute().parent.parent.resolve()

    def binary(self) -> list[str]:
        if not self.preinstalled:
            return [self.INSTALLED_BINARY]
        return [str(self._venv() / "bin" / "python"), "-m", "minisweagent.run.mini"]

    def host_paths(self) -> list[Path]:
        if not self.preinstalled:
            return []
        venv = self._venv()
        paths = [venv]
        # The venv's interpreter is a symlink to its base Python (pyvenv.cfg "home = .../bin").
        cfg = venv / "pyvenv.cfg"
        if cfg.exists():
            for line in cfg.read_text().splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home":
                    paths.append(Path(value.strip()).resolve().parent)
        return paths

    def config_files(self) -> dict[str, str]:
        # JSON is YAML: no YAML writer needed, and every string is quoted safely.
        config: dict = {
            "model": {
                "model_kwargs": {
                    "api_base": self.endpoint_url,
                    "api_key": self.api_key,
                    "drop_params": True,
                }
            },
            "agent": {"step_limit": self.max_steps, "cost_limit": 0},
        }
        if self.MODEL_CLIENT == "litellm":
            return {_CONFIG: json.dumps(config, indent=2)}
        config["model"]["model_class"] = f"{_PLUGIN.stem}.ChatCompletionsModel"
        return {
            _CONFIG: json.dumps(config, indent=2),
            f"{_PLUGIN_DIR}/{_PLUGIN.name}": _PLUGIN.read_text(),
        }

    def env(self) -> dict[str, str]:
        return {
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_CONFIGURED": "true",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_GLOBAL_CONFIG_DIR": f"{self.home}/.config/mini-swe-agent",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PYTHONPATH": f"{self.home}/{_PLUGIN_DIR}",
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def command(self, instruction: str) -> list[str]:
        return [
            *self.binary(),
            "-m",
            f"openai/{self.model_name or 'tiny'}",
            "-t",
            instruction,
            "--yolo",
            "--exit-immediately",
            "-c",
            "mini.yaml",
            "-c",
            f"{self.home}/{_CONFIG}",
            "-o",
            f"{self.home}/mini-trajectory.json",
        ]
