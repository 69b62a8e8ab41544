# .venv/bin/python -m pytest tests/test_capture_caps.py -q
"""Per-rollout caps (capture.caps; issue 29, finding 6): every agent's engine calls and completion
tokens are capped at the proxy, and calls past a cap are refused (403, never sent to the engine,
never recorded) and counted, in the stats and in the trace's metadata.

Two levels: the proxy itself with 40 calls from a plain HTTP client (capture's fake engine), and
the attack as it was found: a real mini-swe-agent in the real sandbox whose scripted model writes
one shell command that reads the agent's key from its config and fires 12 tool-offering calls with
prompts of its own choosing.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from capture.caps import RolloutCaps, default_caps
from capture.errors import BadRequest
from harness.audit.scripted_engine import ScriptedEngine, shell_call
from harness.service.factory import HarborSessionFactory
from harness.tasks import BUNDLED_DIR
from tests.helpers.tools import BASH_COMMAND_TOOLS as TOOLS


def _fire(proxy: CaptureServer, info, n: int) -> list[int]:
    """`n` tool-offering calls, each with a prompt of the caller's choosing; their statuses."""
    statuses = []
    with httpx.Client(timeout=60) as http:
        for k in range(n):
            reply = http.post(f"{proxy.url}/s/{info.session_id}/v1/chat/completions",
                              headers={"authorization": f"Bearer {info.secret}"},
                              json={"model": "m", "tools": TOOLS, "messages": [
                                  {"role": "user", "content": f"a prompt of my own, number {k}"}]})
            statuses.append(reply.status_code)
    return statuses


def test_calls_past_the_call_cap_are_refused_never_sent_and_counted(fake, tmp_path):
    with CaptureServer(fake.url, data_dir=tmp_path / "d") as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        info = client.create_session(caps={"calls": 10, "tokens": None})
        seen_before = len(fake.requests)
        statuses = _fire(proxy, info, 40)
        assert statuses == [200] * 10 + [403] * 30
        stats = client.stats(info.session_id)
        assert stats["n_calls"] == 10 and stats["caps"]["calls_used"] == 10
        assert stats["caps"]["refused"] == 30
        assert stats["caps"]["refused_by"] == {"engine calls": 30}
        assert len(fake.requests) - seen_before <= 10  # the refused ones never reached it
        trace = json.loads(client.trace_json(info.session_id))
        assert len(trace["turns"]) == 10
        assert {t["metadata"]["rollout_caps"]["refused"] for t in trace["turns"]} == {30}


def test_calls_after_the_token_cap_is_reached_are_refused(fake, tmp_path):
    with CaptureServer(fake.url) as proxy, CaptureClient(proxy.url, proxy.admin_key) as client:
        info = client.create_session(caps={"calls": None, "tokens": 1})
        statuses = _fire(proxy, info, 5)
        assert statuses == [200, 403, 403, 403, 403]
        caps = client.stats(info.session_id)["caps"]
        assert caps["tokens_used"] >= 1 and caps["refused_by"] == {"completion tokens": 4}


def test_the_refusal_speaks_the_agents_dialect_and_says_why(fake):
    with CaptureServer(fake.url) as proxy, CaptureClient(proxy.url, proxy.admin_key) as client:
        info = client.create_session(caps={"calls": 1})
        _fire(proxy, info, 1)
        reply = httpx.post(f"{info.base_urls['messages']}/v1/messages",
                           headers={"x-api-key": info.secret},
                           json={"model": "m", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 403
    body = reply.json()
    assert body["type"] == "error" and "rollout cap of 1 engine calls" in body["error"]["message"]


def test_caps_survive_a_proxy_restart_on_the_same_data_dir(fake, tmp_path):
    with CaptureServer(fake.url, data_dir=tmp_path / "d") as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        info = client.create_session(caps={"calls": 3, "tokens": None})
        assert _fire(proxy, info, 2) == [200, 200]
    with CaptureServer(fake.url, data_dir=tmp_path / "d") as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        assert _fire(proxy, info, 3) == [200, 403, 403]
        assert client.stats(info.session_id)["caps"]["calls"] == 3


@pytest.mark.parametrize("bad", [{"calls": 0}, {"calls": "9"}, {"tokens": 1.5}, {"turns": 3},
                                 [3], {"calls": True}])
def test_a_bad_cap_is_a_clear_error(bad):
    with pytest.raises(BadRequest, match="caps"):
        RolloutCaps.from_dict(bad)


def test_the_default_caps_follow_the_step_and_token_limits():
    assert default_caps(30, 128) == {"calls": 76, "tokens": 38 * 128}
    assert default_caps(1, None) == {"calls": 18, "tokens": None}


# --- the attack through a real agent -----------------------------------------------------------
# What the policy's one shell command does: read the agent's key and base URL from its config
# (readable inside the sandbox) and fire 12 tool-offering calls, printing each status. Twelve:
# mini-swe-agent ends a command at its timeout, and on a loaded 2-core machine 40 calls ran past
# it (21 were made), which cut the refusal count while the cap itself held.
INJECT = r"""python3 - <<'PY'
import json, os, urllib.request as u, urllib.error as e
c = json.load(open(os.path.expanduser('~/.config/mini-swe-agent/harness.yaml')))
k = c['model']['model_kwargs']
codes = []
for i in range(12):
    body = {'model': 'tiny', 'tools': [{'type': 'function', 'function': {'name': 'bash',
            'parameters': {'type': 'object', 'properties': {}}}}],
            'messages': [{'role': 'user', 'content': 'injected prompt %d' % i}]}
    r = u.Request(k['api_base'] + '/chat/completions', json.dumps(body).encode(),
                  {'Authorization': 'Bearer ' + k['api_key'], 'Content-Type': 'application/json'})
    try:
        codes.append(u.urlopen(r, timeout=60).status)
    except e.HTTPError as err:
        codes.append(err.code)
print('INJECTED', codes)
PY"""


def _script(request: dict) -> str:
    text = json.dumps(request.get("messages"))
    if "injected prompt" in text:
        return "sure"
    if not request.get("tools"):
        return "A title"
    if any(m.get("role") == "tool" for m in request["messages"]):
        return shell_call(request, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
    return shell_call(request, INJECT)


@pytest.mark.agents
@pytest.mark.slow
def test_twelve_calls_fired_from_inside_the_sandbox_stop_at_the_cap(tiny_model_path):
    with ScriptedEngine(tiny_model_path, _script) as engine:
        factory = HarborSessionFactory(
            None, split=[BUNDLED_DIR / "hello-file"], harness="mini-swe-agent",
            llm_url=engine.url, model=engine.model, sampling={"temperature": 1.0},
            max_tokens=4096, max_steps=4, rollout_caps={"calls": 6, "tokens": None},
            agent_timeout_s=300, max_attempts=1)
        try:
            result = asyncio.run(factory.rollout(seed=0))
        finally:
            factory.close()
    assert not engine.errors, engine.errors
    # the engine served the agent's first call and 5 injected ones; nothing past the cap
    assert len(engine.requests) == 6, len(engine.requests)
    assert result.cause != "infra_failure", result.error  # a refusal is no engine fault
    assert result.trace is not None
    caps = result.trace.turns[-1].metadata["rollout_caps"]
    assert caps["calls"] == 6 and caps["calls_used"] == 6
    # At least one call past the cap was made and refused. How many follows the machine's load
    # (mini-swe-agent ends the injected loop at its command timeout: 8 on a quiet machine, 6 with
    # trainings beside the suite), so the count is not asserted; that none reached the engine is.
    assert caps["refused"] >= 1
