"""The real agent CLIs accept what our dialects send: each completes a scripted tool loop.

    .venv/bin/python -m pytest tests/test_dialects_agents.py -q

A tiny local server (tests/fixtures/dialects/record_agents.py) answers each agent through
`DIALECTS[d]`: call 0 gets reasoning, text and shell tool calls, the next one a final answer.
An agent that could not parse our SSE or reply body would fail its run or never send the tool
results back, so this is the acceptance test of every encoder against its real client:
opencode (streaming chat), Claude Code (streaming messages), Codex (streaming responses),
mini-swe-agent (non-streaming chat). No engine is needed; each run takes ~5-30 s.
"""

from __future__ import annotations

import json

import pytest

from launchers.paths import agent_bin
from tests.fixtures.dialects.record_agents import SHELL, run_agent, serve

pytestmark = [pytest.mark.agents, pytest.mark.slow]


def _available(agent: str) -> bool:
    try:
        return agent_bin(agent).exists()
    except Exception as exc:  # paths raises a clear "run ./setup.sh" error
        print(f"skipping {agent}: {exc}")
        return False


@pytest.mark.parametrize("agent", list(SHELL))
def test_agent_runs_its_tool_loop_through_our_dialect(agent, tmp_path):
    if not _available(agent):
        # ./setup.sh installs every agent: a missing one is a set-up defect, not a reason to skip.
        pytest.fail(f"agent CLI {agent!r} is not installed (./setup.sh installs it)")
    server = serve(agent, tmp_path / "recorded")
    try:
        result = run_agent(agent, f"http://127.0.0.1:{server.server_address[1]}",
                           tmp_path / "home")
    finally:
        server.shutdown()
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    calls = [json.loads(p.read_text()) for p in sorted((tmp_path / "recorded").glob("*.json"))]
    assert len(calls) >= 2
    last = json.dumps(calls[-1]["body"])
    # the tool's output made it back: every agent ran `echo hi` and returned "hi"
    assert "chatcmpl-tool-" in last and "hi" in last
