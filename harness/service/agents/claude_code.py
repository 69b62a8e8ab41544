"""Claude Code (npm `@anthropic-ai/claude-code`, 2.1 here): Anthropic Messages, streaming.

Wire facts (DESIGN.md section 5): `ANTHROPIC_BASE_URL` + `ANTHROPIC_API_KEY`, then
`claude -p ... --dangerously-skip-permissions` (as root also `IS_SANDBOX=1`). It streams
`/v1/messages?beta=true` with 24 tools and probes `HEAD /` first. Its settings, sessions and
caches live in `CLAUDE_CONFIG_DIR` under the sandbox HOME. Every model alias (sonnet, opus,
haiku, the small/fast model) is pinned to the served model, so background calls go to the same
proxy session. Step limit: `--max-turns`. Telemetry, auto-update and error reporting are off.

`--disable-slash-commands`: without it the instruction is followed by ~3.4k tokens of reminders,
most of them the listing of Claude Code's own skills (dataviz, keybindings-help, claude-api, ...),
and a Skill tool. A sandboxed task has no use for them, and a small policy reads the listing as
part of the task (it named files after its words). Without them the tail after the instruction
is ~1k tokens (the environment, the deferred tools, the agent types); the Workflow tool's
description then carries its authoring reference inline, so the whole prompt grows from 17.4k
to 21.0k tokens, all of it before the instruction (one prefix, cached once by vLLM).

`context_window` (a test/measurement knob, off by default). Claude Code 2.1's auto-compact
window comes from `CLAUDE_CODE_AUTO_COMPACT_WINDOW`, but it refuses a window under 100k tokens
(its bundle: values below `1e5` are "below_minimum" and read as 1e5). Under that, the one other
knob is `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE` (its "testPctOverride"): the compaction threshold is
`min(window_eff * pct / 100, window_eff - 13000)` with `window_eff = window - min(max output,
20000)` = 80k for a 100k window. So N >= 100k sets the window; a smaller N keeps the 100k window
and sets pct = 100 N / 80000, which puts the threshold at N tokens. Its compaction request
carries all its tools and orders text only (capture/aux.py tags it by that order); it asks for
`<analysis>` + `<summary>` and carries only the summary block on (capture/placement.py).
"""

from __future__ import annotations

from typing import ClassVar

from harness.service.agents.base import Dialect, HarnessAgent

__all__ = ["ClaudeCodeAgent"]

_MIN_COMPACT_WINDOW = 100_000  # the smallest CLAUDE_CODE_AUTO_COMPACT_WINDOW it accepts
_OUTPUT_RESERVE = 20_000  # what it keeps for the reply out of that window (module doc)


class ClaudeCodeAgent(HarnessAgent):
    NAME: ClassVar[str] = "claude-code"
    DIALECT: ClassVar[Dialect] = "messages"
    CLI: ClassVar[str] = "claude"
    HARBOR_AGENT: ClassVar[str] = "harbor.agents.installed.claude_code:ClaudeCode"
    INSTALLED_BINARY: ClassVar[str] = "claude"

    @staticmethod
    def name() -> str:
        return ClaudeCodeAgent.NAME

    def config_files(self) -> dict[str, str]:
        # An onboarding-complete marker: without it an interactive first-run screen can appear.
        return {".claude/.claude.json": '{"hasCompletedOnboarding": true}\n'}

    def env(self) -> dict[str, str]:
        model = self.model_name or "tiny"
        return {
            "ANTHROPIC_BASE_URL": self.endpoint_url,
            "ANTHROPIC_API_KEY": self.api_key,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "CLAUDE_CONFIG_DIR": f"{self.home}/.claude",
            "IS_SANDBOX": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            **self._compact_env(),
        }

    def _compact_env(self) -> dict[str, str]:
        window = self.context_window
        if window is None:
            return {}
        if window >= _MIN_COMPACT_WINDOW:
            return {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(window)}
        pct = 100 * window / (_MIN_COMPACT_WINDOW - _OUTPUT_RESERVE)
        return {"CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(_MIN_COMPACT_WINDOW),
                "CLAUDE_AUTOCOMPACT_PCT_OVERRIDE": f"{pct:.3f}"}

    def command(self, instruction: str) -> list[str]:
        return [
            *self.binary(),
            "-p",
            instruction,
            "--dangerously-skip-permissions",
            "--disable-slash-commands",
            "--max-turns",
            str(self.max_steps),
            "--model",
            self.model_name or "tiny",
            "--output-format",
            "stream-json",
            "--verbose",
        ]
