"""Several engines behind one proxy (capture.engines): affinity, placement, death, retirement.

The engines are the in-package fake (capture.fake_engine), two or three of them, each told apart
by the requests it saw. Each test attacks one property: a session's calls stay on one engine, a
new session goes to the least-loaded live engine, an engine that dies costs only the calls it had
in flight (infra failures), an engine whose health check fails is left without any call to it,
a retired engine's in-flight calls are cut before the version is stamped, and with no engine
left every call fails naming them all.

Run: .venv/bin/python -m pytest tests/test_capture_engines.py -q
"""

from __future__ import annotations

import threading

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from capture.engines import split_engine_urls
from capture.fake_engine import FakeEngine
from tests.helpers.waiting import wait_until


@pytest.fixture
def fakes():
    engines = [FakeEngine().start() for _ in range(2)]
    yield engines
    for engine in engines:
        engine.stop()


@pytest.fixture
def proxy(fakes):
    with CaptureServer(",".join(f.url for f in fakes), upstream_timeout_s=5.0) as server:
        yield server


@pytest.fixture
def admin(proxy):
    with CaptureClient(proxy.url, proxy.admin_key) as client:
        yield client


def call(info, text: str, stream: bool = False) -> httpx.Response:
    return httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "stream": stream,
                            "messages": [{"role": "user", "content": text}]})


def served_by(fakes, text: str) -> list[int]:
    """Which fakes saw a request whose first message is `text`."""
    return [i for i, f in enumerate(fakes)
            if any(r["messages"][0]["content"] == text for r in f.requests)]


def engines(proxy) -> list[dict]:
    return httpx.get(f"{proxy.admin_url}/admin/weight_version",
                     headers={"authorization": f"Bearer {proxy.admin_key}"}).json()["engines"]


def test_every_call_of_a_session_goes_to_the_engine_of_its_first_call(admin, fakes):
    sessions = [admin.create_session() for _ in range(4)]
    for turn in range(3):
        for k, info in enumerate(sessions):
            assert call(info, f"session {k}", stream=turn == 1).status_code == 200
    homes = [served_by(fakes, f"session {k}") for k in range(4)]
    assert all(len(home) == 1 for home in homes), homes  # never split across engines
    # 4 sessions over 2 engines, each placed on the one with fewer: 2 and 2
    assert sorted(h[0] for h in homes) == [0, 0, 1, 1]
    assert sum(len(f.requests) for f in fakes) == 12


def test_a_new_session_goes_to_the_engine_with_fewest_sessions(admin, proxy, fakes):
    a, b = admin.create_session(), admin.create_session()
    call(a, "a"), call(b, "b")
    assert [served_by(fakes, "a"), served_by(fakes, "b")] == [[0], [1]]
    admin.delete_session(a.session_id)  # engine 0 now holds none, engine 1 one
    c = admin.create_session()
    call(c, "c")
    assert served_by(fakes, "c") == [0]
    assert [e["sessions"] for e in engines(proxy)] == [1, 1]


def test_sessions_that_come_one_at_a_time_take_turns_over_the_engines(admin, fakes):
    for k in range(4):  # each deleted before the next: every placement is a tie at 0 sessions
        info = admin.create_session()
        call(info, f"one {k}")
        admin.delete_session(info.session_id)
    assert [served_by(fakes, f"one {k}") for k in range(4)] == [[0], [1], [0], [1]]


def test_an_engine_that_dies_costs_only_its_in_flight_calls(admin, proxy, fakes):
    a, b = admin.create_session(), admin.create_session()
    call(a, "a"), call(b, "b")  # a on engine 0, b on engine 1
    fakes[1].stop()  # connection refused from now on
    failed = call(b, "b")
    assert failed.status_code == 502
    # the failed call is an infra failure of b's rollout: its cause is infra_failure
    assert admin.stats(b.session_id)["failed_calls"]["infra"] == 1
    assert [e["out"] is None for e in engines(proxy)] == [True, False]
    # a never noticed; a new session goes to the engine left
    assert call(a, "a").status_code == 200 and admin.stats(a.session_id)["n_failed"] == 0
    c = admin.create_session()
    assert call(c, "c").status_code == 200 and served_by(fakes, "c") == [0]
    assert httpx.get(f"{proxy.url}/health").json()["engines"] == {"live": 1, "total": 2}


def test_a_session_whose_engine_died_between_its_calls_moves_and_loses_nothing(
        admin, proxy, fakes):
    a, b, d = (admin.create_session() for _ in range(3))
    call(a, "a"), call(b, "b"), call(d, "d")  # engines 0, 1, 0
    fakes[1].stop()
    c = admin.create_session()  # placed on engine 1 (1 session against 2), which refuses: out
    assert call(c, "c").status_code == 502
    # b had nothing in flight when engine 1 went: its next call is served by engine 0
    assert call(b, "b").status_code == 200 and served_by(fakes, "b") == [0, 1]
    assert admin.stats(b.session_id)["n_failed"] == 0
    assert [e["sessions"] for e in engines(proxy)] == [3, 1]  # c moves at its next call


def test_an_engine_failing_its_health_check_is_left_without_a_call_to_it(admin, proxy, fakes):
    proxy.state.engines.health_interval_s = 0.2  # read by the checker the first call starts
    a = admin.create_session()
    call(a, "a")
    fakes[1].stop()
    wait_until(lambda: engines(proxy)[1]["out"] is not None, "engine 1 out by its health check")
    assert "health" in engines(proxy)[1]["out"]


def test_a_dropped_stream_does_not_take_out_an_engine_that_is_still_healthy(admin, proxy, fakes):
    a, b = admin.create_session(), admin.create_session()
    call(a, "a"), call(b, "b")
    fakes[1].fault = "disconnect:2"
    with httpx.stream("POST", f"{b.base_urls['chat']}/chat/completions",
                      headers={"authorization": f"Bearer {b.secret}"},
                      json={"model": "m", "stream": True,
                            "messages": [{"role": "user", "content": "b"}]}) as reply:
        reply.read()
    assert admin.stats(b.session_id)["failed_calls"]["infra"] == 1
    fakes[1].fault = None
    assert call(b, "b").status_code == 200  # probed, healthy, kept
    assert all(e["out"] is None for e in engines(proxy))


def test_with_no_engine_left_every_call_fails_naming_each_engine(admin, fakes):
    info = admin.create_session()
    call(info, "x")
    for fake in fakes:
        fake.stop()
    call(info, "x")  # its engine refuses: out
    other = admin.create_session()
    call(other, "y")  # the other refuses too: out
    reply = call(admin.create_session(), "z")
    message = reply.json()["error"]["message"]
    assert reply.status_code == 502 and "no engine left" in message
    assert all(f.url in message for f in fakes)


def test_a_retired_engine_has_its_in_flight_calls_cut_before_the_version_is_stamped(
        admin, proxy, fakes):
    a, b = admin.create_session(), admin.create_session()
    call(a, "a"), call(b, "b")  # b on engine 1
    fakes[1].fault = "hang"
    replies: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: replies.append(call(b, "b")))
    waiting.start()
    wait_until(lambda: admin.stats(b.session_id)["in_flight"] == 1, "b's call in flight")
    admin.set_weight_version(1, retired=[fakes[1].url + "/v1"])  # the /v1 form names it too
    waiting.join(timeout=10)
    # cut, not left to hang until the 5 s timeout and then be recorded at version 1
    assert replies and replies[0].status_code == 502
    failures = admin.stats(b.session_id)["failures"]
    assert failures[-1]["weight_version_start"] == 0
    assert engines(proxy)[1]["out"].startswith("retired")
    assert call(b, "b").status_code == 200 and served_by(fakes, "b") == [0, 1]


def test_retiring_an_engine_the_proxy_does_not_have_is_refused(admin):
    with pytest.raises(Exception, match="not one of this proxy's engines"):
        admin.set_weight_version(1, retired=["http://127.0.0.1:1"])


def test_one_engine_is_never_taken_out():
    with FakeEngine() as fake, CaptureServer(fake.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        info = admin.create_session()
        fake.fault = "disconnect:0"
        call(info, "x")
        fake.fault = None
        assert call(info, "x").status_code == 200
        assert engines(proxy)[0]["out"] is None


def test_engine_urls_are_split_to_server_roots_and_checked():
    assert split_engine_urls("http://a:1/v1/, http://b:2") == ["http://a:1", "http://b:2"]
    with pytest.raises(ValueError, match="twice"):
        split_engine_urls("http://a:1,http://a:1/v1")
    with pytest.raises(ValueError, match="no engine URL"):
        split_engine_urls(" , ")
