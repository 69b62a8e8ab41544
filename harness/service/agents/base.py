"""`HarnessAgent`: a Harbor agent that points a real agent CLI at one capture-proxy session.

One decision: an agent class only *describes* how its CLI is configured (config files under the
sandbox's HOME, environment variables, one command line); the shared `setup()`/`run()` here do
the I/O through Harbor's `BaseEnvironment`, so every agent is configured the same auditable way
and runs under any Harbor backend (our bubblewrap sandbox, docker, e2b, ...).

Rules every agent follows:
- Endpoint and secret reach the CLI only through files inside the sandbox's own HOME or the
  process environment of the agent command. Never a global file of the host, never the host's
  environment (the sandbox passes only what `env()` returns).
- A step limit (the CLI's own knob where it has one) and a timeout (the command is killed).
- Preinstalled (`preinstalled=True`, the local sandbox): the CLI comes from the host's
  `launchers.paths.agent_bin()`, bound read-only into the sandbox (`host_paths()`), and nothing
  is installed (Harbor 0.25 has no skip-install switch; this flag is ours). Elsewhere
  (`preinstalled=False`) Harbor's own installed-agent class installs the CLI (`HARBOR_AGENT`).

What this module refuses to do: drive the agent turn by turn, parse its output into rewards, or
retry. The session owns timing and failure classification; this class reports the exit status.
"""

from __future__ import annotations

import base64
import importlib
import logging
import math
import os
import shlex
from abc import abstractmethod
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar, Literal

# Harbor imports litellm, which otherwise fetches its price map from GitHub at import: ~8 s of
# retries on this offline machine, for numbers Harness never uses.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from harbor.agents.base import BaseAgent  # noqa: E402
from harbor.environments.base import BaseEnvironment, ExecResult  # noqa: E402
from harbor.models.agent.context import AgentContext  # noqa: E402

__all__ = ["Dialect", "HarnessAgent"]

Dialect = Literal["chat", "responses", "messages"]

# Where HOME goes when the sandbox has none (or an unwritable one): inside the sandbox's /tmp.
_FALLBACK_HOME = "/tmp/agent-home"
_EXEC_GRACE_S = 15


class HarnessAgent(BaseAgent):
    """Base of the four agents. A subclass sets the class constants and three small methods.

    Constructor arguments beyond Harbor's (`logs_dir`, `model_name`):
      base_url:     the session's base URL for this agent's dialect (SessionInfo.base_urls[dialect])
      api_key:      the session secret
      max_steps:    the agent's own step/turn limit
      timeout_s:    the agent command is killed after this many seconds
      preinstalled: True = use the host's CLI (local sandbox); False = install it with Harbor
      context_window: None (default) = the CLI's own idea of the model's window; N = tell the CLI
                    the model holds N tokens, so it compacts its history (summarises it) well
                    before the engine's limit. A test and measurement knob (issue 34: compaction
                    is trainable); each agent's module says which of its settings it sets;
                    mini-swe-agent never compacts and ignores it. N must leave room for the
                    agent's own first prompt, or it compacts before every call.
    """

    NAME: ClassVar[str]
    DIALECT: ClassVar[Dialect]
    CLI: ClassVar[str]  # name for launchers.paths.agent_bin()
    HARBOR_AGENT: ClassVar[str]  # "module:Class" of Harbor's installed agent, used to install
    INSTALLED_BINARY: ClassVar[str]  # the CLI's name on PATH after Harbor installed it
    NATIVE_STEP_LIMIT: ClassVar[bool] = True  # False: the session enforces max_steps itself
    # True: the proxy refuses the agent's model call that offers tools past max_steps (capture.
    # sessions.take_step), for a CLI with no step option (Codex) or a soft one (opencode runs the
    # tools of its text-only wrap-up turn).
    PROXY_STEP_LIMIT: ClassVar[bool] = False

    def __init__(
        self,
        logs_dir: Path,
        model_name: str | None = None,
        logger: logging.Logger | None = None,
        *,
        base_url: str = "",
        api_key: str = "",
        max_steps: int = 30,
        timeout_s: float = 600.0,
        preinstalled: bool = True,
        context_window: int | None = None,
        **kwargs: Any,
    ) -> None:
        # Harbor's own `base_url` kwarg is for its model-connection resolver, which we bypass:
        # the proxy URL is handed over as our own field, so BaseAgent never sees it.
        super().__init__(logs_dir, model_name=model_name, logger=logger, **kwargs)
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if context_window is not None and context_window < 1024:
            raise ValueError(f"context_window must be None or >= 1024 tokens, got {context_window}")
        self.endpoint_url = base_url.rstrip("/")
        self.api_key = api_key
        self.max_steps = max_steps
        self.timeout_s = timeout_s
        self.preinstalled = preinstalled
        self.context_window = context_window
        self.home = _FALLBACK_HOME
        self.result: ExecResult | None = None

    # ---- what a subclass describes -------------------------------------------------------------

    def config_files(self) -> dict[str, str]:
        """Files to write before the run: path relative to HOME -> text. Default: none."""
        return {}

    def env(self) -> dict[str, str]:
        """Environment of the agent command (on top of HOME, which the base sets)."""
        return {}

    @abstractmethod
    def command(self, instruction: str) -> list[str]:
        """argv of the agent run, starting with `*self.binary()`."""

    # ---- shared machinery -----------------------------------------------------------------------

    def _init_model_info(self) -> None:
        # Harbor parses "provider/model" through litellm, whose import costs ~22 s here (measured
        # on the first session of a process). The model is the proxy's served name: no parsing.
        self._parsed_model_provider = None
        self._parsed_model_name = self.model_name

    @staticmethod
    def name() -> str:
        # Harbor calls name() on the class; subclasses override with their NAME.
        return "harness-agent"

    def version(self) -> str | None:
        return None

    def binary(self) -> list[str]:
        """argv prefix that starts the CLI: the host's resolved binary, or the installed name."""
        if not self.preinstalled:
            return [self.INSTALLED_BINARY]
        from launchers.paths import agent_bin

        return [str(agent_bin(self.CLI).resolve())]

    def host_paths(self) -> list[Path]:
        """Host paths the local sandbox must bind read-only so `binary()` runs inside it."""
        if not self.preinstalled:
            return []
        from launchers.paths import agent_bin

        real = agent_bin(self.CLI).resolve()
        # npm CLIs live in <tools>/node_modules/...: bind the whole tools dir (the native
        # platform packages sit beside the launcher).
        for parent in real.parents:
            if parent.name == "node_modules":
                return [parent.parent]
        return [real.parent]

    def full_env(self) -> dict[str, str]:
        return {"HOME": self.home, **self.env()}

    def shell_command(self, instruction: str) -> str:
        """The exact shell line `run()` executes (stdin closed: these CLIs must not wait on it)."""
        line = f"exec {shlex.join(self.command(instruction))} </dev/null"
        if self.preinstalled:
            return line
        # Where Harbor's installers put the CLIs: nvm's node (npm -g) and ~/.local/bin (uv, the
        # Claude installer); the same preamble Harbor's own run commands use.
        preamble = (
            '[ -f "$HOME/.nvm/nvm.sh" ] && . "$HOME/.nvm/nvm.sh"; PATH="$HOME/.local/bin:$PATH"'
        )
        return f"{preamble}; {line}"

    async def setup(self, environment: BaseEnvironment) -> None:
        if not self.preinstalled:
            await self._harbor_install(environment)
        self.home = await self._sandbox_home(environment)
        files = self.config_files()
        if not files:
            return
        # One exec writes every file; base64 keeps arbitrary JSON/TOML safe from shell quoting.
        steps = []
        for relative, text in files.items():
            path = PurePosixPath(self.home) / relative
            blob = base64.b64encode(text.encode()).decode()
            steps.append(
                f"mkdir -p {shlex.quote(str(path.parent))} && "
                f"printf %s {blob} | base64 -d > {shlex.quote(str(path))} && "
                f"chmod 600 {shlex.quote(str(path))}"
            )
        result = await environment.exec(" && ".join(steps), env={"HOME": self.home})
        if result.return_code != 0:
            raise RuntimeError(
                f"{self.NAME}: writing its config under HOME={self.home} failed "
                f"(exit {result.return_code}): {(result.stderr or result.stdout or '')[-500:]}"
            )

    async def run(
        self, instruction: str, environment: BaseEnvironment, context: AgentContext
    ) -> None:
        """Run the CLI to its end (or its timeout); the exit status lands in `self.result`."""
        self.result = await environment.exec(
            self.shell_command(instruction),
            env=self.full_env(),
            # A backstop: the session stops the agent at timeout_s; this fires only if it cannot.
            timeout_sec=math.ceil(self.timeout_s) + _EXEC_GRACE_S,
        )
        context.metadata = {
            **(context.metadata or {}),
            "agent": self.NAME,
            "exit_code": self.result.return_code,
        }

    async def _sandbox_home(self, environment: BaseEnvironment) -> str:
        probe = await environment.exec(
            'h="${HOME:-}"; [ -n "$h" ] && [ "$h" != / ] && mkdir -p "$h" 2>/dev/null '
            f'&& [ -w "$h" ] || {{ h={_FALLBACK_HOME}; mkdir -p "$h"; }}; printf %s "$h"'
        )
        home = (probe.stdout or "").strip()
        if probe.return_code != 0 or not home.startswith("/"):
            raise RuntimeError(
                f"{self.NAME}: could not find or create a writable HOME in the sandbox "
                f"(exit {probe.return_code}, stdout {probe.stdout!r}, stderr {probe.stderr!r})"
            )
        return home

    async def _harbor_install(self, environment: BaseEnvironment) -> None:
        module_name, _, class_name = self.HARBOR_AGENT.partition(":")
        harbor_cls = getattr(importlib.import_module(module_name), class_name)
        installer = harbor_cls(logs_dir=self.logs_dir, model_name=self.model_name)
        await installer.install(environment)
