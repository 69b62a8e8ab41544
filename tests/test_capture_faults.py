"""Faults: a failing engine and bad agent input never crash the proxy or reach a trace.

The engine is the in-package fake (capture.fake_engine) with a fault switched on: HTTP 500, a
hang, a refused connection, a stream dropped mid-reply, a reply without token ids, logprobs paired
with the wrong ids. Each must give the agent an error in its own dialect, be recorded as a failed
(never trainable) call, and leave the proxy serving the next call.

Run: .venv/bin/python -m pytest tests/test_capture_faults.py -q
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from capture import CaptureClient, CaptureServer, NothingTrainableError
from capture.fake_engine import FakeEngine
from tests.helpers.waiting import wait_until

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
def fake():
    with FakeEngine() as engine:
        yield engine


@pytest.fixture
def proxy(fake):
    with CaptureServer(fake.url, upstream_timeout_s=1.0, max_body_bytes=64 * 1024) as server:
        yield server


@pytest.fixture
def client(proxy):
    with CaptureClient(proxy.url, proxy.admin_key) as admin:
        yield admin


def send(info, dialect: str = "chat", stream: bool = False, **body) -> httpx.Response:
    if dialect == "messages":
        url = f"{info.base_urls['messages']}/v1/messages"
        payload = {"model": "m", "max_tokens": 64, "messages": MESSAGES, "stream": stream}
    elif dialect == "responses":
        url = f"{info.base_urls['responses']}/responses"
        payload = {"model": "m", "input": "hello", "stream": stream}
    else:
        url = f"{info.base_urls['chat']}/chat/completions"
        payload = {"model": "m", "messages": MESSAGES, "stream": stream}
    return httpx.post(url, json={**payload, **body}, timeout=30,
                      headers={"authorization": f"Bearer {info.secret}"})


def failure_causes(client, info) -> dict[str, int]:
    return client.stats(info.session_id)["failed"]


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages"])
def test_an_engine_500_gives_the_agent_a_502_in_its_own_dialect(client, fake, dialect):
    info = client.create_session()
    fake.fault = "http500"
    reply = send(info, dialect)
    assert reply.status_code == 502
    body = reply.json()
    if dialect == "messages":
        assert body["type"] == "error" and "500" in body["error"]["message"]
    else:
        assert "500" in body["error"]["message"]
    assert failure_causes(client, info) == {"EngineHTTPError": 1}


def test_the_proxy_keeps_serving_after_an_engine_failure(client, fake):
    info = client.create_session()
    fake.fault = "http500"
    assert send(info).status_code == 502
    fake.fault = None
    assert send(info).status_code == 200
    stats = client.stats(info.session_id)
    assert (stats["n_ok"], stats["n_failed"]) == (1, 1)


def test_a_hanging_engine_times_out_as_504_and_is_recorded(client, fake):
    info = client.create_session()
    fake.fault = "hang"
    started = time.monotonic()
    reply = send(info)
    # the fake hangs for an hour: a 504 well before the client's 30 s is the 1 s timeout firing
    assert reply.status_code == 504 and time.monotonic() - started < 25
    assert failure_causes(client, info) == {"EngineTimeout": 1}


def test_a_refused_connection_is_a_502_naming_the_engine():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with CaptureServer(dead) as proxy:
        admin = CaptureClient(proxy.url, proxy.admin_key)
        info = admin.create_session()
        reply = send(info)
        assert reply.status_code == 502 and dead in reply.json()["error"]["message"]


def test_a_stream_dropped_mid_reply_ends_with_a_dialect_error_event(client, fake):
    info = client.create_session()
    fake.fault = "disconnect:4"
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions",
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as reply:
        assert reply.status_code == 200  # the agent was already receiving tokens
        events = [line for line in reply.iter_lines() if line.startswith("data:")]
    assert len(events) >= 4
    assert "error" in json.loads(events[-1][5:])
    assert failure_causes(client, info) == {"EngineDisconnected": 1}


def test_a_stream_dropped_mid_reply_gives_claude_code_an_anthropic_error_event(client, fake):
    info = client.create_session()
    fake.fault = "disconnect:4"
    with httpx.stream("POST", f"{info.base_urls['messages']}/v1/messages",
                      headers={"x-api-key": info.secret},
                      json={"model": "m", "max_tokens": 50, "messages": MESSAGES,
                            "stream": True}) as reply:
        text = reply.read().decode()
    assert "event: error" in text


def test_a_reply_without_token_ids_is_a_failed_call_not_a_trainable_one(client, fake):
    info = client.create_session()
    fake.fault = "no_token_ids"
    reply = send(info)
    assert reply.status_code == 502
    assert "--return-tokens-as-token-ids" in reply.json()["error"]["message"]
    with pytest.raises(NothingTrainableError) as caught:
        client.trace_json(info.session_id)
    assert "EngineNoTokenIds" in " ".join(caught.value.reasons)


@pytest.mark.parametrize("stream", [False, True])
def test_sampled_ids_that_are_not_token_ids_fail_the_call_after_the_agent_is_answered(
        client, fake, stream):
    # The id/logprob pairing of a whole reply runs after the answer is sent; the ids it then
    # refuses must still make the call a failed one, never a trainable one.
    info = client.create_session()
    fake.fault = "negative_ids"
    reply = send(info, stream=stream)
    assert reply.status_code == 200
    if stream:
        assert reply.text.rstrip().endswith("data: [DONE]")
    else:
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
    assert failure_causes(client, info) == {"EngineNoTokenIds": 1}
    with pytest.raises(NothingTrainableError):
        client.trace_json(info.session_id)


def test_logprobs_paired_with_the_wrong_ids_are_masked_with_the_reason(client, fake):
    info = client.create_session()
    fake.fault = "bad_logprob_pairing"
    assert send(info).status_code == 200  # the agent is served; only training is refused
    with pytest.raises(NothingTrainableError) as caught:
        client.trace_json(info.session_id)
    assert "logprob_pairing_mismatch" in " ".join(caught.value.reasons)


def test_a_good_call_after_a_masked_one_makes_the_session_trainable(client, fake):
    info = client.create_session()
    fake.fault = "bad_logprob_pairing"
    send(info)
    fake.fault = None
    send(info, messages=[{"role": "user", "content": "again"}])
    turns = json.loads(client.trace_json(info.session_id))["turns"]
    masked, good = turns
    assert sum(masked["loss_mask"]) == 0 and masked["metadata"]["masked_logprobs"]
    assert sum(good["loss_mask"]) == len(good["completion_token_ids"])


def test_an_agent_that_hangs_up_mid_stream_is_recorded_and_the_proxy_serves_on(client, fake):
    info = client.create_session()
    fake.token_delay_s = 0.05
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions",
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as reply:
        next(reply.iter_lines())  # read one event, then hang up
    wait_until(lambda: client.stats(info.session_id)["n_failed"] > 0,
               "the proxy to record the hung-up call as failed")
    assert failure_causes(client, info) == {"AgentDisconnected": 1}
    fake.token_delay_s = 0.0
    assert send(info).status_code == 200


def test_streamed_tokens_reach_the_agent_as_the_engine_makes_them(client, fake):
    info = client.create_session()
    fake.token_delay_s = 0.1  # ~20 chunks: the whole reply takes ~2 s
    started = time.monotonic()
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions",
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "messages": MESSAGES, "stream": True}) as reply:
        lines = reply.iter_lines()
        next(lines)
        first_byte = time.monotonic() - started
        list(lines)
        total = time.monotonic() - started
    # not buffered until the end: the first event comes long before the last (~2 s of tokens;
    # a proxy that buffered would put the first byte after them all, so only a > 1 s stall on a
    # loaded machine could fail this with a proxy that streams)
    assert total > 1.6 and first_byte < total / 2, (first_byte, total)


def test_malformed_json_is_a_400_with_a_clear_message(client):
    info = client.create_session()
    reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", content=b'{"messages": [',
                       headers={"authorization": f"Bearer {info.secret}",
                                "content-type": "application/json"})
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
    assert client.stats(info.session_id)["n_calls"] == 0


def test_a_wrong_content_type_is_a_415(client):
    info = client.create_session()
    reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", content=b"hello",
                       headers={"authorization": f"Bearer {info.secret}",
                                "content-type": "text/plain"})
    assert reply.status_code == 415 and "application/json" in reply.json()["error"]["message"]


def test_an_oversized_body_is_a_413(client):
    info = client.create_session()
    huge = [{"role": "user", "content": "x" * 100_000}]  # the fixture caps bodies at 64 KiB
    reply = send(info, messages=huge)
    assert reply.status_code == 413 and "limit" in reply.json()["error"]["message"]


def test_a_json_array_body_is_a_400(client):
    info = client.create_session()
    reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", json=[1, 2],
                       headers={"authorization": f"Bearer {info.secret}"})
    assert reply.status_code == 400 and "JSON object" in reply.json()["error"]["message"]


def test_a_body_the_dialect_rejects_is_a_4xx_and_not_recorded(client):
    info = client.create_session()
    reply = send(info, "messages", messages="not a list")
    assert 400 <= reply.status_code < 500
    assert client.stats(info.session_id)["n_calls"] == 0
