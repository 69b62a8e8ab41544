# .venv/bin/python -m pytest tests/test_service_dropped_connections.py -q
"""A connection that breaks under a request to the rollout service loses no rollout, runs none
twice, and does not make the client avoid a service that is up.

Real pieces: a `python -m harness.serve` process, its capture proxy, bubblewrap, mini-swe-agent
and Harbor's verifier on the bundled hello-file task, the trainer's `RemoteSessionFactory`; the
engine is scripted (harness/audit/scripted_engine.py) so every rollout passes. Between client
and service, tests/helpers/drop_relay.py breaks the connections of chosen requests: before the
request reached the service (what a request sent on a keep-alive connection that the service
is closing meets), and after the service did the work (its answer lost on the way).

Before this was handled, the first break of each kind cost the whole service `down_s` (30 s) of
no admissions, a dropped admission's answer started the rollout twice, and a dropped poll wrote
off a rollout the service was running well as lost (an infra failure, its engine time wasted).
On the session surface a dropped create's answer left a session holding a slot until the service
stopped, and a verify could not be sent again (the verifier would have run twice).
"""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from harness.audit.scripted_engine import ScriptedEngine, shell_task
from harness.client.remote import RemoteSessionFactory
from harness.service.state import OpenSession, RolloutService
from harness.tasks import BUNDLED_DIR
from tests.helpers.drop_relay import Break, DropRelay
from tests.helpers.service import start_service

pytestmark = [pytest.mark.agents]

HELLO = str(BUNDLED_DIR / "hello-file")
SCRIPT = shell_task("printf 'Hello, Harness!\\n' > /app/greeting.txt",
                    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", final="Done.")
KEY = "test-service-key"
OPTIONS = dict(harness="mini-swe-agent", model="tiny", sampling={"temperature": 1.0},
               max_tokens=256, max_steps=4, agent_timeout_s=120, verifier_timeout_s=60,
               max_attempts=1)


def _metrics(url: str) -> dict:
    return httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"},
                     timeout=10).json()


def test_broken_connections_neither_lose_nor_repeat_a_rollout(tiny_model_path, tmp_path):
    breaks = [
        # the first admission: the service admits and starts it, its 202 never arrives
        Break("POST", "/v1/rollouts", when="after", how="fin"),
        # the first poll never reaches the service (a reset, as from a closing keep-alive)
        Break("GET", "/v1/rollouts/", when="before", how="rst"),
        # an answer that hands a result over is lost after the service let go of it (from the
        # second poll on: the first one's repeat is the same poll, whose one repeat is spent)
        Break("GET", "/v1/rollouts/", nth=2, when="done", how="fin"),
    ]
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY)
        parts = urlsplit(service.url)
        relay = DropRelay((parts.hostname, parts.port), breaks)
        client = RemoteSessionFactory([relay.url], KEY, max_concurrent_rollouts=1, **OPTIONS)
        try:
            async def two() -> list:
                return [await asyncio.wait_for(client.rollout(seed=0), 240) for _ in range(2)]

            t0 = time.monotonic()
            results = asyncio.run(two())
            took = time.monotonic() - t0
            metrics = _metrics(service.url)
        finally:
            client.close()
            relay.close()
            service.stop()

    assert [b.done for b in breaks] == [True, True, True], \
        f"the relay did not break every request it was told to: {relay.broken}"
    for r in results:  # both whole: a trace, the verifier's reward
        assert (r.cause, r.env_reward) == ("ok", 1.0), (r.cause, r.error)
        assert r.trace is not None and len(r.trace.turns) == 2
    # The service ran exactly the two rollouts asked for: the admission sent again after its
    # answer was lost got the same rollout, not a second one.
    assert metrics["admitted"] == 2 and metrics["rollouts_by_cause"]["ok"] == 2, metrics
    assert sum(metrics["rollouts_by_cause"].values()) == 2, metrics
    assert metrics["in_flight"] == 0
    # Each break cost one request sent again, nothing else: no rollout lost or moved to another
    # service, and the service never taken for down (that would have cost 30 s of admissions).
    assert client.pool.resent == 3 and client.lost == 0 and client.retries == 0
    assert client.counts["ok"] == 2 and client.counts["infra_failure"] == 0
    assert client.pool.services[0].down_until == 0.0
    assert took < client.pool.down_s + 60, f"two rollouts took {took:.0f} s"
    posts = [p for m, p in relay.requests if m == "POST" and p == "/v1/rollouts"]
    assert len(posts) == 3  # two rollouts, one of them sent twice


def _read_response(conn: socket.socket) -> bytes:
    """One whole HTTP response (head and its Content-Length body): a response can arrive in
    several reads, and the next exchange must start after this one's last byte."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data  # closed: b"" when nothing came
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_the_service_keeps_an_idle_connection_past_the_clients_expiry(tiny_model_path,
                                                                      tmp_path):
    """httpx's pool keeps an idle connection 5 s; a service that closed it at 5 s too (uvicorn's
    default) would race the client's next request on it. Here it outlives the client's
    (harness.serve.KEEP_ALIVE_S)."""
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY)
        parts = urlsplit(service.url)
        request = (f"GET /health HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n").encode()
        try:
            with socket.create_connection((parts.hostname, parts.port), timeout=30) as conn:
                answers = []
                for pause in (0.0, httpx.Limits().keepalive_expiry + 2.0):
                    time.sleep(pause)
                    conn.sendall(request)
                    answers.append(_read_response(conn))
        finally:
            service.stop()
    assert answers[0].startswith(b"HTTP/1.1 200") and answers[0].endswith(b"}"), answers[0]
    assert answers[1].startswith(b"HTTP/1.1 200") and answers[1].endswith(b"}"), \
        f"the service closed the idle connection within 7 s: {answers[1]!r}"


def test_a_sessions_broken_connections_neither_lose_it_nor_make_or_grade_a_second(
        tiny_model_path, tmp_path):
    """The OpenEnv session surface (TRL's HarnessRolloutWorker's, `RemoteSession`) across the
    same breaks: a create whose answer is lost (a second session would hold a slot nobody
    closes), a wait reset on the way, a verify whose answer is lost (sent again, it would run
    the verifier a second time on a graded sandbox), a trace and a close reset on the way; and
    the trainer's weight version push, its answer lost."""
    breaks = [
        Break("POST", "/v1/weight_version", when="after", how="fin"),
        Break("POST", "/v1/sessions$", when="after", how="fin"),
        Break("POST", "/v1/sessions/[0-9a-f]+/wait", when="before", how="rst"),
        Break("GET", "/v1/sessions/[0-9a-f]+/trace", when="before", how="rst"),
        Break("POST", "/v1/sessions/[0-9a-f]+/verify", when="after", how="fin"),
        Break("DELETE", "/v1/sessions/[0-9a-f]+$", when="before", how="rst"),
    ]
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY)
        relay = DropRelay((urlsplit(service.url).hostname, urlsplit(service.url).port), breaks)
        client = RemoteSessionFactory([relay.url], KEY, max_concurrent_rollouts=1, **OPTIONS)
        try:
            client.set_weight_version(3)
            session = client.create(seed=0)
            while_open = _metrics(service.url)
            assert session.wait_for_completion() == 0
            trace = session.fetch_training_trace()
            verdict = session.verify()
            session.close()
            metrics = _metrics(service.url)
        finally:
            client.close()
            relay.close()
            service.stop()

    assert [b.done for b in breaks] == [True] * 6, \
        f"the relay did not break every request it was told to: {relay.broken}"
    assert while_open["open_sessions"] == 1 and while_open["admitted"] == 1, while_open
    assert len(trace.turns) == 2 and verdict.env_reward == 1.0, verdict
    assert {t.metadata["weight_version_start"] for t in trace.turns} == {3}
    assert metrics["sessions_graded"] == 1, metrics  # the verify sent again got the one verdict
    assert metrics["open_sessions"] == 0 and metrics["in_flight"] == 0, metrics
    assert client.pool.resent == 6 and client.retries == 0
    assert client.pool.services[0].down_until == 0.0
    creates = [p for m, p in relay.requests if m == "POST" and p == "/v1/sessions"]
    assert len(creates) == 2  # one session, its create sent twice


def test_a_session_no_client_calls_is_closed_after_the_result_ttl(tiny_model_path, tmp_path):
    """A session whose client went away (or whose create's answer never arrived and was not
    sent again) would hold one of the service's slots until it stops; a session no client called
    for --result-ttl-s is closed, while one called since is not (one in a long poll: the next
    test)."""
    ttl = 4.0
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY,
                                extra_args=["--result-ttl-s", str(ttl)])
        client = RemoteSessionFactory([service.url], KEY, max_concurrent_rollouts=2, **OPTIONS)
        try:
            left = client.create(seed=0)  # never called again
            kept = client.create(seed=0)
            assert kept.wait_for_completion() == 0
            time.sleep(ttl + 1)
            assert _metrics(service.url)["open_sessions"] == 2  # nothing swept them yet
            kept_verdict = kept.verify()  # a call: kept is its client's again
            third = client.create(seed=0)  # an admission sweeps: left is closed
            deadline = time.monotonic() + 60
            while _metrics(service.url)["open_sessions"] != 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            metrics = _metrics(service.url)
            with pytest.raises(Exception, match="no longer knows"):
                left.fetch_training_trace()
            kept.close()
            third.close()
            after = _metrics(service.url)
        finally:
            client.close()
            service.stop()
    assert kept_verdict.env_reward == 1.0
    assert metrics["open_sessions"] == 2, metrics  # kept and third; left closed
    assert after["open_sessions"] == 0 and after["in_flight"] == 0, after
    assert "no client called it for 4 s" in service.log.read_text()


def test_a_session_whose_client_is_in_a_long_poll_is_not_taken_for_abandoned():
    """The sweep's other half, on the service's state alone: a session whose last call ended
    longer than the ttl ago but whose client is in a call now (a long poll outlasting the ttl)
    stays open; once the call ends it is its client's for another ttl."""
    closed: list[str] = []

    class Session:  # what the sweep calls on a HarborSession
        task_id = "t"

        def __init__(self, name: str) -> None:
            self.name = name

        async def a_close(self) -> None:
            closed.append(self.name)

    async def scenario() -> None:
        service = RolloutService("http://127.0.0.1:1", key="k", result_ttl_s=10.0)
        for sid in ("polling", "gone"):
            service.sessions[sid] = OpenSession(Session(sid))
            service.sessions[sid].called -= 11.0  # last call ended 11 s ago
        with service.using_session("polling"):
            service.sessions["polling"].called -= 11.0  # a poll open past the ttl
            assert service.admit() is None  # an admission sweeps
            await asyncio.sleep(0)
            await asyncio.gather(*service._closing.values())
        assert closed == ["gone"] and set(service.sessions) == {"polling"}
        assert service.admit() is None  # the poll just ended: not stale
        await asyncio.sleep(0)
        assert closed == ["gone"] and set(service.sessions) == {"polling"}

    asyncio.run(scenario())
