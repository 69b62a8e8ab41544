"""Safe on a public port (issue 15, item 6; capture/guard.py): what a peer without a session key,
or with a slow or greedy connection, can make the proxy do; and what the trace says about a reply
the proxy's cap cut, and Claude Code's `message_start` prompt length.

Raw sockets where the point is what happens before a request is whole (an HTTP client would not
send half a request). Every wait is on a condition (a reply, a closed connection) with a generous
deadline, never a fixed window.

    .venv/bin/python -m pytest tests/test_capture_public.py -q
"""

from __future__ import annotations

import json
import socket
import sys

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from capture.guard import Limits
from capture.replies import truncation

GENEROUS_S = 120.0
HI = [{"role": "user", "content": "hi"}]


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=GENEROUS_S)
    sock.settimeout(GENEROUS_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the generous deadline)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def head(info, path: str, key: str, length: int) -> bytes:
    return (f"POST /s/{info.session_id}/v1/{path} HTTP/1.1\r\nhost: x\r\n"
            f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n\r\n").encode()


@pytest.fixture
def guarded(fake, tmp_path):
    """A proxy with short read times (so their expiry is what a test waits on)."""
    limits = Limits(header_timeout_s=0.5, body_timeout_s=0.5)
    with CaptureServer(fake.url, data_dir=tmp_path / "d", limits=limits) as proxy:
        yield proxy, CaptureClient(proxy.url, proxy.admin_key)


# --- the session key before the body ------------------------------------------------------------
@pytest.mark.parametrize(("which", "status"), [("wrong key", 401), ("unknown session", 404)])
def test_a_call_is_refused_from_its_head_before_any_body_byte_is_sent(client, proxy, which,
                                                                      status):
    info = client.create_session()
    if which == "unknown session":
        info = info.__class__("no-such-session", info.secret, info.base_urls)
    with connect(proxy.url) as sock:
        # a 30 MB body is announced and never sent: the answer cannot wait for it
        sock.sendall(head(info, "chat/completions", "wrong" if status == 401 else info.secret,
                          30_000_000))
        answer = read_until_closed(sock)
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:200]
    assert b"connection: close" in answer.lower()
    body = json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["message"]  # in the dialect's own error shape
    if status == 401:
        assert client.stats(info.session_id)["n_calls"] == 0


def test_a_refused_body_is_dropped_and_its_connection_closed(client, proxy):
    info = client.create_session()
    with connect(proxy.url) as sock:
        sock.sendall(head(info, "messages", "wrong", 5000) + b"x" * 5000)
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 401 ") and answer.count(b"HTTP/1.1") == 1
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["type"] == "error"  # Anthropic's shape


# --- read times -----------------------------------------------------------------------------------
def test_a_head_that_never_ends_gets_408_and_the_connection_closes(guarded):
    proxy, admin = guarded
    with connect(proxy.url) as sock:
        sock.sendall(b"POST /s/x/v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # no end of head
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_connection_that_sends_nothing_is_closed(guarded):
    proxy, _ = guarded
    with connect(proxy.url) as sock:
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_body_that_never_ends_gets_408_and_nothing_is_recorded(guarded):
    proxy, admin = guarded
    info = admin.create_session()
    with connect(proxy.url) as sock:
        sock.sendall(head(info, "chat/completions", info.secret, 1000) + b'{"model": "m", ')
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert admin.stats(info.session_id)["n_calls"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_that_takes_longer_than_the_read_times_still_arrives(guarded, fake, stream):
    """The read times bound a request's head and body, not the call."""
    proxy, admin = guarded
    info = admin.create_session()
    fake.token_delay_s = 0.1  # ~25 tokens: the reply takes ~2.5 s, the read times are 0.5 s
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", timeout=GENEROUS_S,
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "messages": HI, "stream": stream}) as reply:
        assert reply.status_code == 200
        reply.read()
    assert admin.stats(info.session_id)["n_ok"] == 1


# --- connections and memory -------------------------------------------------------------------
def test_connections_past_the_bound_get_503(fake):
    with CaptureServer(fake.url, limits=Limits(max_connections=2)) as proxy:
        admin = CaptureClient(proxy.url, proxy.admin_key)
        info = admin.create_session()
        admin.close()
        idle = [connect(proxy.url), connect(proxy.url)]
        try:
            reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=GENEROUS_S,
                               headers={"authorization": f"Bearer {info.secret}"},
                               json={"model": "m", "messages": HI})
            assert reply.status_code == 503
        finally:
            for sock in idle:
                sock.close()


def test_a_session_over_its_memory_bound_is_refused_with_a_clear_413(fake):
    with CaptureServer(fake.url, limits=Limits(max_session_bytes=64)) as proxy:
        admin = CaptureClient(proxy.url, proxy.admin_key)
        info = admin.create_session()
        send = lambda: httpx.post(  # noqa: E731
            f"{info.base_urls['chat']}/chat/completions", timeout=GENEROUS_S,
            headers={"authorization": f"Bearer {info.secret}"}, json={"model": "m", "messages": HI})
        assert send().status_code == 200  # its tokens take the session past 64 bytes
        refused = send()
        assert refused.status_code == 413
        assert "max_session_bytes" in refused.json()["error"]["message"]
        other = admin.create_session()  # another session is not affected
        assert httpx.post(f"{other.base_urls['chat']}/chat/completions", timeout=GENEROUS_S,
                          headers={"authorization": f"Bearer {other.secret}"},
                          json={"model": "m", "messages": HI}).status_code == 200


# --- admin routes -----------------------------------------------------------------------------
def test_admin_routes_are_not_served_on_the_public_listener(fake):
    with CaptureServer(fake.url, admin_on_public=False) as proxy:
        assert proxy.admin_url != proxy.url
        headers = {"authorization": f"Bearer {proxy.admin_key}"}
        public = httpx.post(f"{proxy.url}/admin/sessions", headers=headers, timeout=GENEROUS_S)
        assert public.status_code == 404
        assert httpx.get(f"{proxy.url}/admin/sessions", headers=headers,
                         timeout=GENEROUS_S).status_code == 404
        admin = CaptureClient(proxy.admin_url, proxy.admin_key)
        info = admin.create_session()
        assert info.base_urls["chat"].startswith(proxy.url + "/")  # the agents' listener
        # agents call the public listener
        reply = httpx.post(f"{proxy.url}/s/{info.session_id}/v1/chat/completions",
                           timeout=GENEROUS_S, headers={"authorization": f"Bearer {info.secret}"},
                           json={"model": "m", "messages": HI})
        assert reply.status_code == 200
        assert admin.stats(info.session_id)["n_ok"] == 1


def test_on_loopback_admin_routes_share_the_one_listener(proxy):
    assert proxy.admin_url == proxy.url


def test_a_proxy_that_cannot_run_the_guard_binds_nothing_and_says_why(fake, monkeypatch):
    # uvicorn without the protocol capture.guard wraps (a None in sys.modules fails its import)
    monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.h11_impl", None)
    server = CaptureServer(fake.url, host="0.0.0.0")
    with pytest.raises(RuntimeError, match="bound request heads"):
        server.start()
    assert server._runner is None


# --- what the trace and the agent are told ------------------------------------------------------
@pytest.mark.parametrize(("finish", "requested", "sent", "cap", "expected"), [
    ("length", 4096, 64, 64, (True, "proxy_cap")),
    ("length", None, 64, 64, (True, "proxy_cap")),
    ("length", 32, 32, 64, (True, "agent_max_tokens")),
    ("length", 64, 64, 64, (True, "agent_max_tokens")),
    ("length", None, None, None, (True, "context")),
    ("stop", 4096, 64, 64, (False, None)),
    ("tool_calls", None, 64, 64, (False, None)),
])
def test_truncation_says_whose_limit_cut_the_reply(finish, requested, sent, cap, expected):
    assert truncation(finish, {"requested": requested, "sent": sent}, cap) == expected


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_cut_by_the_proxy_cap_is_marked_truncated_in_the_trace(client, stream):
    info = client.create_session(sampling={"max_tokens": 3})
    body = {"model": "m", "messages": HI, "max_tokens": 500, "stream": stream}
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", json=body,
                      headers={"authorization": f"Bearer {info.secret}"},
                      timeout=GENEROUS_S) as reply:
        assert reply.status_code == 200
        reply.read()
    turn = json.loads(client.trace_json(info.session_id))["turns"][-1]
    assert len(turn["completion_token_ids"]) == 3
    assert turn["metadata"]["finish_reason"] == "length"
    assert (turn["metadata"]["truncated"], turn["metadata"]["truncated_by"]) == (True,
                                                                                 "proxy_cap")


def test_a_whole_reply_is_not_marked_truncated(client):
    info = client.create_session(sampling={"max_tokens": 500})
    httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=GENEROUS_S,
               headers={"authorization": f"Bearer {info.secret}"},
               json={"model": "m", "messages": HI})
    metadata = json.loads(client.trace_json(info.session_id))["turns"][-1]["metadata"]
    assert (metadata["truncated"], metadata["truncated_by"]) == (False, None)


def test_claude_codes_message_start_reports_the_real_prompt_length(client):
    info = client.create_session()
    body = {"model": "m", "max_tokens": 64, "stream": True, "system": "You are Claude.",
            "messages": [{"role": "user", "content": "hello there, " * 20}]}
    events = []
    with httpx.stream("POST", f"{info.base_urls['messages']}/v1/messages", json=body,
                      headers={"x-api-key": info.secret}, timeout=GENEROUS_S) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    start = next(e for e in events if e["type"] == "message_start")
    prompt = json.loads(client.trace_json(info.session_id))["turns"][-1]["prompt_token_ids"]
    assert start["message"]["usage"]["input_tokens"] == len(prompt) > 0


@pytest.mark.parametrize("policy", ["train", "mask", "drop"])
def test_the_trainer_trains_masks_or_drops_a_truncated_turn_as_set(client, policy):
    from trainer.rows import trace_to_rows

    info = client.create_session(sampling={"max_tokens": 3})
    httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=GENEROUS_S,
               headers={"authorization": f"Bearer {info.secret}"},
               json={"model": "m", "messages": HI})
    trace = json.loads(client.trace_json(info.session_id))
    rows, report = trace_to_rows(trace, truncated=policy)
    counts = report.counts()
    assert counts["truncated_turn"] == 1
    if policy == "train":
        assert [row.n_trainable for row in rows] == [3]
    elif policy == "mask":
        assert [row.n_trainable for row in rows] == [0] and counts["truncated_turn_masked"] == 1
    else:
        assert rows == [] and counts["truncated_rollout_dropped"] == 1


def test_a_head_past_the_size_bound_is_refused_and_the_connection_closes(proxy):
    # h11's own bound (capture.guard.server_options): uvicorn answers 400 and closes
    with connect(proxy.url) as sock:
        sock.sendall(b"POST /s/x/v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-pad: "
                     + b"a" * (Limits().max_header_bytes + 4096))  # and no end of head
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]


def test_a_large_body_sent_with_its_head_in_one_write_is_served(client, proxy, fake):
    info = client.create_session()
    content = "x" * (4 * Limits().max_header_bytes)  # far past the head bound, in the body
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})
    with connect(proxy.url) as sock:
        sock.sendall(head(info, "chat/completions", info.secret, len(body)) + body.encode())
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_a_later_head_on_a_kept_alive_connection_has_the_same_read_time(guarded):
    proxy, _ = guarded
    with connect(proxy.url) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        first = b""
        while b'"ok"' not in first:
            first += sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # and no end of head
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")


def test_a_call_pipelined_with_the_next_request_is_answered_and_so_is_the_next(client, proxy):
    info = client.create_session()
    body = json.dumps({"model": "m", "messages": HI}).encode()
    with connect(proxy.url) as sock:
        sock.sendall(head(info, "chat/completions", info.secret, len(body)) + body
                     + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        got = b""
        while b'"weight_version"' not in got:
            chunk = sock.recv(65536)
            assert chunk, got
            got += chunk
    assert got.count(b"HTTP/1.1 200 ") == 2 and b'"choices"' in got
    assert client.stats(info.session_id)["n_ok"] == 1
