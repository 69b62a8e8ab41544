"""opencode (npm `opencode-ai`, 1.18 here): OpenAI chat completions, streaming.

Wire facts (DESIGN.md section 5): a provider in `opencode.json` with
`{"npm": "@ai-sdk/openai-compatible", "options": {"baseURL": ".../v1", "apiKey": ...}}`, then
`opencode run -m <provider>/<model>`. It fires a title-generator call first (an aux turn).
The config goes to `$HOME/.config/opencode/opencode.json` inside the sandbox and is also named
by `OPENCODE_CONFIG`, so no project or host config can replace the endpoint. Step limit: the
`build` agent's `steps`, set to max_steps + 1. opencode's last step is its wrap-up: it sends a
"MAXIMUM STEPS REACHED ... respond with text only" assistant message after the history, so a
`steps` of N leaves N - 1 steps to act in. With `steps` = max_steps (as before) a 1-step rollout's
only turn was the wrap-up, and the model was told not to touch the task it was graded on. The
wrap-up still offers the tools, and opencode runs the calls a model makes there anyway (a warm
model made 5 steps in a 1-step rollout, until the session's call ceiling), so the proxy refuses
that call (`PROXY_STEP_LIMIT`: a call that offers tools past max_steps gets a 403). Models, LSP
and update downloads are switched off: the sandbox has no network but the proxy, and each attempt
would cost a timeout.

`context_window` (a test/measurement knob, off by default): the model's
`limit: {context: N, output: min(4096, N // 4)}` in the provider's model entry. opencode 1.18
compacts when a reply's usage (prompt + completion tokens) reaches `context - output` (its
bundle: `SessionCompaction.isOverflow`; `compaction.auto` defaults to true): it then sends its
"context summarization agent" call without tools and goes on from a history that holds the
summary (tests/test_compaction_agents.py). An unset `output` would count as its 32k output cap
and make every window under that compact at once.
"""

from __future__ import annotations

import json
from typing import ClassVar

from harness.service.agents.base import Dialect, HarnessAgent

__all__ = ["OpenCodeAgent"]

_PROVIDER = "harness"
_CONFIG = ".config/opencode/opencode.json"


class OpenCodeAgent(HarnessAgent):
    NAME: ClassVar[str] = "opencode"
    DIALECT: ClassVar[Dialect] = "chat"
    CLI: ClassVar[str] = "opencode"
    HARBOR_AGENT: ClassVar[str] = "harbor.agents.installed.opencode:OpenCode"
    INSTALLED_BINARY: ClassVar[str] = "opencode"
    PROXY_STEP_LIMIT: ClassVar[bool] = True  # its wrap-up turn still runs tools (module doc)

    @staticmethod
    def name() -> str:
        return OpenCodeAgent.NAME

    def config_files(self) -> dict[str, str]:
        model = self.model_name or "tiny"
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"{_PROVIDER}/{model}",
            "small_model": f"{_PROVIDER}/{model}",
            "provider": {
                _PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Harness capture proxy",
                    "options": {"baseURL": self.endpoint_url, "apiKey": self.api_key},
                    "models": {model: self._model_entry(model)},
                }
            },
            "agent": {"build": {"steps": self.max_steps + 1}},  # + its wrap-up (module doc)
            "permission": {"edit": "allow", "bash": "allow", "webfetch": "deny"},
            # Its undo snapshots (a git write-tree of the work dir each step), language servers
            # and formatters serve an editor, not a graded rollout: 8.0-8.8 -> 9.4-9.5 rollouts
            # a minute at concurrency 4 without them (2 cores, scripted engine).
            "snapshot": False,
            "lsp": False,
            "formatter": False,
        }
        return {_CONFIG: json.dumps(config, indent=2)}

    def _model_entry(self, model: str) -> dict[str, object]:
        if self.context_window is None:
            return {"name": model}
        window = self.context_window
        return {"name": model, "limit": {"context": window, "output": min(4096, window // 4)}}

    def env(self) -> dict[str, str]:
        return {
            "OPENCODE_CONFIG": f"{self.home}/{_CONFIG}",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_DISABLE_PROJECT_CONFIG": "1",
            "OPENCODE_DISABLE_CLAUDE_CODE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_FAKE_VCS": "git",
            "XDG_CONFIG_HOME": f"{self.home}/.config",
            "XDG_DATA_HOME": f"{self.home}/.local/share",
            "XDG_STATE_HOME": f"{self.home}/.local/state",
            "XDG_CACHE_HOME": f"{self.home}/.cache",
        }

    def command(self, instruction: str) -> list[str]:
        model = self.model_name or "tiny"
        return [
            *self.binary(),
            "run",
            "--format",
            "json",
            "-m",
            f"{_PROVIDER}/{model}",
            "--auto",
            "--",
            instruction,
        ]
