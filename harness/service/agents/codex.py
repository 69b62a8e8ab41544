"""Codex (npm `@openai/codex`, 0.171 here): OpenAI Responses only, streaming.

Wire facts (DESIGN.md section 5): `$CODEX_HOME/config.toml` with a `model_providers` entry
(`wire_api = "responses"`, `base_url`, `env_key`), then `codex exec --skip-git-repo-check
--dangerously-bypass-approvals-and-sandbox ...`. `OPENAI_BASE_URL` alone is not honoured.
`CODEX_HOME` is a directory under the sandbox HOME; the secret reaches Codex only through the
environment variable its `env_key` names. Codex has no turn-limit option, so the proxy refuses
its model call past `max_steps` (`PROXY_STEP_LIMIT`, a 403) and the session stops it when it
sees the refusal or a call past `max_steps` (`NATIVE_STEP_LIMIT = False`): its last allowed reply
and the tools it asks for run; the timeout still applies. Without the refusal, the session's 1 s
poll let Codex make 5 calls of a 1-step rollout against an instant engine.

`context_window` (a test/measurement knob, off by default): `model_context_window = N` and
`model_auto_compact_token_limit = 0.9 N` in config.toml (Codex's own keys): past that many
tokens Codex sends its "CONTEXT CHECKPOINT COMPACTION" request and goes on from a history that
holds the summary (tests/test_compaction_agents.py). The request goes without tools, as a root of
its own; a window whose limit is under Codex's own ~13k-token first prompt (tiny tokenizer)
compacts before every call (1,412 summary calls in 300 s at 12k).
"""

from __future__ import annotations

import json
from typing import ClassVar

from harness.service.agents.base import Dialect, HarnessAgent

__all__ = ["CodexAgent"]

_KEY_ENV = "HARNESS_PROXY_API_KEY"


def _toml_string(value: str) -> str:
    # A JSON string literal is a valid TOML basic string (same escapes for what we write).
    return json.dumps(value)


class CodexAgent(HarnessAgent):
    NAME: ClassVar[str] = "codex"
    DIALECT: ClassVar[Dialect] = "responses"
    CLI: ClassVar[str] = "codex"
    HARBOR_AGENT: ClassVar[str] = "harbor.agents.installed.codex:Codex"
    INSTALLED_BINARY: ClassVar[str] = "codex"
    NATIVE_STEP_LIMIT: ClassVar[bool] = False
    PROXY_STEP_LIMIT: ClassVar[bool] = True

    @staticmethod
    def name() -> str:
        return CodexAgent.NAME

    def config_files(self) -> dict[str, str]:
        model = self.model_name or "tiny"
        lines = [
            f"model = {_toml_string(model)}",
            'model_provider = "harness"',
            'approval_policy = "never"',
            'sandbox_mode = "danger-full-access"',
            "check_for_update_on_startup = false",
            "",
            "[model_providers.harness]",
            'name = "Harness capture proxy"',
            f"base_url = {_toml_string(self.endpoint_url)}",
            f"env_key = {_toml_string(_KEY_ENV)}",
            'wire_api = "responses"',
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
        ]
        if self.context_window is not None:
            # top-level keys: they must come before the first [table]
            lines[5:5] = [f"model_context_window = {self.context_window}",
                          f"model_auto_compact_token_limit = {self.context_window * 9 // 10}"]
        return {".codex/config.toml": "\n".join(lines)}

    def env(self) -> dict[str, str]:
        return {_KEY_ENV: self.api_key, "CODEX_HOME": f"{self.home}/.codex"}

    def command(self, instruction: str) -> list[str]:
        return [
            *self.binary(),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-m",
            self.model_name or "tiny",
            "--",
            instruction,
        ]
