"""Scripted agents for the session tests: a `HarnessAgent` whose CLI is a shell script.

The factory, session-protocol, step-limit and public-bind tests each need an agent whose every
move is exact (one engine call, a crash, a hang, a probe of the proxy) without a real agent CLI
or a model that must happen to say the right thing. The agent here is `sh -c SCRIPT` in the
real sandbox, with ENDPOINT, KEY and CALL_PY in its environment: `CALL` makes one engine call
through the capture proxy with the standard library, `SOLVE` solves the bundled hello-file task.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, ClassVar

from harness.service.agents.base import HarnessAgent
from harness.service.factory import HarborSessionFactory
from harness.shared.rollout import RolloutResult
from harness.tasks import BUNDLED_DIR

__all__ = ["CALL", "CALL_PY", "HELLO", "SOLVE", "make_factory", "run_rollout", "script_agent"]

HELLO = BUNDLED_DIR / "hello-file"

# One engine call from inside the sandbox, with the standard library (the sandbox has python3).
CALL_PY = (
    "import json,os,urllib.request as u;"
    "r=u.Request(os.environ['ENDPOINT']+'/chat/completions',"
    "json.dumps({'model':'tiny','messages':[{'role':'user','content':'hi'}]}).encode(),"
    "{'Authorization':'Bearer '+os.environ['KEY'],'Content-Type':'application/json'});"
    "u.urlopen(r,timeout=30).read()"
)
CALL = 'python3 -c "$CALL_PY"'
SOLVE = "printf 'Hello, Harness!\\n' > /app/greeting.txt"


def script_agent(script: str, agent_name: str = "script") -> type[HarnessAgent]:
    """An agent class whose CLI is `sh -c script` (ENDPOINT/KEY/CALL_PY in its environment)."""

    class ScriptAgent(HarnessAgent):
        NAME: ClassVar[str] = agent_name
        DIALECT: ClassVar[str] = "chat"  # type: ignore[assignment]
        CLI: ClassVar[str] = "mini"
        HARBOR_AGENT: ClassVar[str] = "harbor.agents.nop:NopAgent"
        INSTALLED_BINARY: ClassVar[str] = "sh"

        @staticmethod
        def name() -> str:
            return agent_name

        def host_paths(self) -> list[Path]:
            return []

        def env(self) -> dict[str, str]:
            return {"ENDPOINT": self.endpoint_url, "KEY": self.api_key, "CALL_PY": CALL_PY}

        def command(self, instruction: str) -> list[str]:
            return ["/bin/sh", "-c", script]

    return ScriptAgent


def make_factory(fake_engine: Any, script: str, split: list[Path] | None = None,
                 **kwargs: Any) -> HarborSessionFactory:
    """A factory on `fake_engine` (capture.fake_engine) running `script` as the agent, on
    hello-file unless `split` says otherwise; short timeouts and backoff, three attempts."""
    options: dict[str, Any] = dict(
        split=split or [HELLO],
        harness=script_agent(script),
        llm_url=fake_engine.url,
        sampling={"temperature": 1.0},
        agent_timeout_s=30,
        max_attempts=3,
        backoff_s=0.01,
    )
    options.update(kwargs)
    return HarborSessionFactory(None, **options)


def run_rollout(factory: HarborSessionFactory, **kwargs: Any) -> RolloutResult:
    """One rollout run to its end, then the factory closed (its proxy, sandboxes, trial dirs)."""
    try:
        return asyncio.run(factory.rollout(**kwargs))
    finally:
        factory.close()
