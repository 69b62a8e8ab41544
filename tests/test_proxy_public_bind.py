# .venv/bin/python -m pytest tests/test_proxy_public_bind.py -q
"""A capture proxy on a public address (`--proxy-host 0.0.0.0`; issue 29, finding 10) serves its
admin routes on their own loopback listener, and a sandbox is never given a way to that listener:
it is forwarded to the agent listener only (`GET /admin/agent_url`, `ProxyLink.agent_url`).

The real local sandbox and a shell-script agent (tests/test_factory_causes.py) that makes one
engine call through its endpoint, then tries the admin listener's port; only a reached admin
listener would let it write the answer the grader pays for.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from capture import CaptureServer
from harness.service.factory import HarborSessionFactory
from harness.service.proxy_link import ProxyLink
from tests.helpers.sessions import CALL, HELLO, SOLVE, run_rollout, script_agent


def test_the_agent_url_of_a_public_proxy_is_its_agent_listener_never_the_admin_one(fake):
    with CaptureServer(fake.url, host="0.0.0.0") as proxy:
        link = ProxyLink(proxy.admin_url, proxy.admin_key)  # as a factory given a running proxy
        url = asyncio.run(link.agent_url())
        assert url == proxy.url != proxy.admin_url
        # the admin routes are not served where agents are sent
        assert httpx.get(f"{url}/admin/sessions",
                         headers={"authorization": f"Bearer {proxy.admin_key}"}).status_code == 404
    with CaptureServer(fake.url) as loopback:
        link = ProxyLink(loopback.admin_url, loopback.admin_key)
        assert asyncio.run(link.agent_url()) == loopback.url == loopback.admin_url


def test_a_sandbox_of_a_public_proxy_reaches_the_agent_listener_and_not_the_admin_one(fake):
    with CaptureServer(fake.url, host="0.0.0.0") as proxy:
        admin_port = proxy.admin_port
        probe = (f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                 f"{admin_port}), timeout=5)\"")
        agent = script_agent(f"{CALL} && {probe} && {SOLVE}", agent_name="admin-prober")
        factory = HarborSessionFactory(proxy.admin_url, admin_key=proxy.admin_key, split=[HELLO],
                                       harness=agent, agent_timeout_s=60, max_attempts=1)
        result = run_rollout(factory, seed=0)
    assert result.trace is not None and len(result.trace.turns) >= 1, result.error  # it reached
    assert (result.cause, result.env_reward) == ("model_failure", 0.0), (result.cause,
                                                                         result.error)


@pytest.fixture(scope="module")
def fake():
    from capture.fake_engine import FakeEngine

    with FakeEngine() as engine:
        yield engine
