"""Sessions of the capture proxy: keys, isolation, admin API, side routes, persistence, CLI.

Behind the in-package fake engine (capture.fake_engine), so each test runs in milliseconds; the
real engine's token fidelity is tested in test_capture_engine.py.

Run: .venv/bin/python -m pytest tests/test_capture_sessions.py -q
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from capture import BadSessionKey, CaptureClient, CaptureServer, NothingTrainableError
from capture.app import create_app
from tests.helpers.capture_client import chat
from tests.helpers.capture_client import conversation as agent_loop
from tests.helpers.tools import BASH_TOOLS as TOOLS

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 40}


def conversation(info, turns: int) -> list[dict]:
    """An agent loop from a long system prompt (a prefix worth sharing): `turns` calls."""
    return agent_loop(info, turns, messages=[SYSTEM, {"role": "user", "content": "fix the bug"}])


def test_a_wrong_key_gets_401_and_nothing_is_recorded(client):
    info = client.create_session()
    reply = chat(info, [{"role": "user", "content": "hi"}], key="not-the-secret")
    assert reply.status_code == 401
    assert "session secret" in reply.json()["error"]["message"]
    assert client.stats(info.session_id)["n_calls"] == 0


def test_a_missing_key_gets_401(client):
    info = client.create_session()
    assert chat(info, [{"role": "user", "content": "hi"}], key=None).status_code == 401


def test_the_x_api_key_header_is_accepted_as_the_session_secret(client):
    info = client.create_session()
    reply = httpx.post(f"{info.base_urls['messages']}/v1/messages", headers={
        "x-api-key": info.secret}, json={"model": "m", "max_tokens": 50,
                                         "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["type"] == "message"


def test_one_sessions_secret_does_not_open_another_session(client):
    mine, theirs = client.create_session(), client.create_session()
    assert chat(theirs, [{"role": "user", "content": "hi"}], key=mine.secret).status_code == 401
    assert client.stats(theirs.session_id)["n_calls"] == 0


def test_sessions_never_see_each_others_calls(client):
    first, second = client.create_session(), client.create_session()
    conversation(first, 2)
    conversation(second, 3)
    assert len(json.loads(client.trace_json(first.session_id))["turns"]) == 2
    turns = json.loads(client.trace_json(second.session_id))["turns"]
    assert {t["metadata"]["session_id"] for t in turns} == {second.session_id}


def test_an_unknown_session_is_404_and_says_how_to_create_one(proxy):
    reply = httpx.post(f"{proxy.url}/s/nosuch/v1/chat/completions", json={})
    assert reply.status_code == 404
    assert "POST /admin/sessions" in reply.json()["error"]["message"]


@pytest.mark.parametrize("method,path", [("POST", "/admin/sessions"),
                                         ("GET", "/admin/sessions"),
                                         ("POST", "/admin/weight_version")])
def test_admin_routes_need_the_admin_key(proxy, method, path):
    reply = httpx.request(method, f"{proxy.url}{path}", headers={"authorization": "Bearer x"},
                          json={"version": 1})
    assert reply.status_code == 401


def test_a_session_secret_is_not_an_admin_key(proxy, client):
    info = client.create_session()
    with pytest.raises(BadSessionKey):
        CaptureClient(proxy.url, info.secret).training_trace(info.session_id)


def test_an_invalid_sampling_policy_is_refused_when_the_session_is_created(proxy):
    reply = httpx.post(f"{proxy.url}/admin/sessions", json={"sampling": {"top_p": 7}},
                       headers={"authorization": f"Bearer {proxy.admin_key}"})
    assert reply.status_code == 400 and "top_p" in reply.json()["error"]["message"]


def test_side_routes_answer_without_being_recorded(client):
    info = client.create_session()
    headers = {"x-api-key": info.secret}
    root = info.base_urls["messages"]
    assert httpx.head(f"{root}/", headers=headers).status_code == 200
    assert httpx.get(f"{info.base_urls['chat']}/models", headers=headers).json()["data"][0]["id"]
    count = httpx.post(f"{root}/v1/messages/count_tokens", headers=headers, json={
        "model": "m", "messages": [{"role": "user", "content": "count me"}]})
    assert count.status_code == 200 and count.json()["input_tokens"] > 0
    assert client.stats(info.session_id)["n_calls"] == 0


def test_the_sampling_policy_is_what_the_engine_receives(client, fake):
    info = client.create_session(sampling={"temperature": 0.6, "max_tokens": 64})
    chat(info, [{"role": "user", "content": "hi"}], temperature=0.1, top_p=0.5, max_tokens=999)
    sent = fake.requests[-1]
    assert (sent["temperature"], sent["top_p"], sent["top_k"], sent["max_tokens"]) == (
        0.6, 1.0, -1, 64)
    assert sent["logprobs"] is True and sent["top_logprobs"] == 0 and sent["return_token_ids"]


def test_the_enforced_sampling_is_recorded_on_the_turn(client):
    info = client.create_session(sampling={"temperature": 0.6, "max_tokens": 64})
    chat(info, [{"role": "user", "content": "hi"}], temperature=0.1, top_p=0.5, max_tokens=999)
    sampling = json.loads(client.trace_json(info.session_id))["turns"][0]["metadata"]["sampling"]
    assert sampling["overridden"] == {"temperature": 0.1, "top_p": 0.5}
    assert sampling["max_tokens"] == {"requested": 999, "sent": 64}


def test_the_weight_version_at_the_start_and_end_of_a_call_is_recorded(client, fake):
    info = client.create_session()
    client.set_weight_version(3)
    fake.token_delay_s = 0.05  # a streamed reply of ~20 chunks takes ~1 s
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {info.secret}"}) as reply:
        lines = reply.iter_lines()
        next(lines)
        client.set_weight_version(4)  # the trainer pushed new weights mid-call
        list(lines)
    metadata = json.loads(client.trace_json(info.session_id))["turns"][0]["metadata"]
    assert (metadata["weight_version_start"], metadata["weight_version_end"]) == (3, 4)


def test_a_lora_version_sends_the_call_to_its_adapter_read_with_the_version_at_the_start(
        client, fake):
    """LoRA runs (trainer/weight_sync/lora.py): the proxy is told (version, adapter name) and
    names that adapter in the engine request, whatever the agent asked for; a version told
    mid-call changes neither the adapter the call was sent to nor its start stamp."""
    info = client.create_session()
    client.set_weight_version(3, "tiny-lora-v3")
    fake.token_delay_s = 0.05
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", json={
            "model": "the-agents-choice", "stream": True,
            "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {info.secret}"}) as reply:
        lines = reply.iter_lines()
        next(lines)
        client.set_weight_version(4, "tiny-lora-v4")
        list(lines)
    assert fake.requests[-1]["model"] == "tiny-lora-v3"
    metadata = json.loads(client.trace_json(info.session_id))["turns"][0]["metadata"]
    assert (metadata["weight_version_start"], metadata["engine_model"]) == (3, "tiny-lora-v3")
    client.set_weight_version(5)  # back to the engine's own model (a full-weight run)
    chat(info, [{"role": "user", "content": "again"}])
    assert fake.requests[-1]["model"] != "tiny-lora-v4"
    with pytest.raises(Exception, match="model"):
        client.set_weight_version(6, "")


def test_an_empty_session_is_not_trainable_and_says_why(client):
    info = client.create_session()
    with pytest.raises(NothingTrainableError) as caught:
        client.trace_json(info.session_id)
    assert "never reached" in caught.value.reasons[0]


def test_the_trace_endpoint_answers_409_with_json_reasons(proxy, client):
    info = client.create_session()
    reply = httpx.get(f"{proxy.url}/admin/sessions/{info.session_id}/trace",
                      headers={"authorization": f"Bearer {proxy.admin_key}"})
    assert reply.status_code == 409 and reply.json()["reasons"]


def test_every_call_is_appended_to_the_session_log_as_it_completes(client, proxy):
    """A call is logged right after its answer leaves, before the proxy reads anything else: so
    whatever reaches the proxy next (the agent's next call, this admin request) finds it on disk.
    """
    info = client.create_session()
    log = proxy.data_dir / "sessions" / info.session_id / "calls.jsonl"

    def call_lines() -> int:  # (the log's other line is the node-id reservation: sessions.py)
        return sum(b'"kind":"call"' in line for line in log.read_bytes().splitlines())

    conversation(info, 2)
    assert client.stats(info.session_id)["n_ok"] == 2
    assert call_lines() == 2
    conversation(info, 1)
    assert client.stats(info.session_id)["n_ok"] == 3
    assert call_lines() == 3


def test_the_session_file_holding_the_secret_is_private(client, proxy):
    info = client.create_session()
    mode = (proxy.data_dir / "sessions" / info.session_id / "session.json").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600


def test_a_restarted_proxy_recovers_sessions_traces_and_keys(fake, tmp_path):
    data_dir = tmp_path / "capture"
    with CaptureServer(fake.url, data_dir=data_dir) as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session(sampling={"temperature": 0.9})
        messages = conversation(info, 3)
        before = admin.trace_json(info.session_id)
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as second:
        admin = CaptureClient(second.url, second.admin_key)
        assert admin.trace_json(info.session_id) == before
        # the agent's key still works, and its next call chains onto the recovered graph
        moved = info.__class__(info.session_id, info.secret, {
            k: v.replace(first.url, second.url) for k, v in info.base_urls.items()})
        assert chat(moved, messages).status_code == 200
        turns = json.loads(admin.trace_json(info.session_id))["turns"]
        assert turns[-1]["metadata"]["parent_id"] == turns[-2]["node_id"]
        assert turns[-1]["metadata"]["sampling"]["policy"]["temperature"] == 0.9


def test_a_torn_last_log_line_is_skipped_and_counted(fake, tmp_path):
    data_dir = tmp_path / "capture"
    with CaptureServer(fake.url, data_dir=data_dir) as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session()
        conversation(info, 2)
    log = data_dir / "sessions" / info.session_id / "calls.jsonl"
    log.write_bytes(log.read_bytes() + b'{"kind": "call", "node_')  # crash mid-write
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as second:
        stats = CaptureClient(second.url, second.admin_key).stats(info.session_id)
    assert (stats["n_ok"], stats["torn_log_lines"]) == (2, 1)


def test_deleting_a_session_forgets_it_and_its_log(client, proxy):
    info = client.create_session()
    conversation(info, 1)
    client.delete_session(info.session_id)
    assert not (proxy.data_dir / "sessions" / info.session_id).exists()
    assert chat(info, [{"role": "user", "content": "hi"}]).status_code == 404


def test_python_m_capture_serves_and_writes_a_private_admin_key_file(fake, tmp_path):
    key_file = tmp_path / "admin.key"
    process = subprocess.Popen(
        [sys.executable, "-m", "capture", "--engine-url", fake.url, "--port", "0",
         "--admin-key-file", str(key_file), "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        url = process.stdout.readline().split()[3]  # "capture proxy on URL -> ENGINE"
        assert url.startswith("http://127.0.0.1:")
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        admin = CaptureClient(url, key_file.read_text().strip())
        info = admin.create_session()
        assert chat(info, [{"role": "user", "content": "hi"}], tools=None).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=15)
    assert process.returncode == 0


def test_python_m_capture_never_prints_a_generated_admin_key(fake, tmp_path):
    # No --admin-key-file: the generated key goes to <data-dir>/admin.key (0600), and stdout only
    # names that file, so a log of the proxy's output never holds the key.
    data_dir = tmp_path / "data"
    process = subprocess.Popen(
        [sys.executable, "-m", "capture", "--engine-url", fake.url, "--port", "0",
         "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    try:
        url = process.stdout.readline().split()[3]
        key_line = process.stdout.readline().strip()
        key_file = data_dir / "admin.key"
        assert key_line == f"admin key in {key_file}"
        assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
        key = key_file.read_text().strip()
        assert len(key) >= 32 and key not in key_line
        assert CaptureClient(url, key).create_session().session_id
    finally:
        process.terminate()
        out, _ = process.communicate(timeout=15)
    assert key not in out


def test_stats_report_turns_roots_and_trainable_tokens(client):
    info = client.create_session()
    conversation(info, 3)
    stats = client.stats(info.session_id)
    assert stats["graph"]["n_turns"] == 3 and stats["graph"]["n_roots"] == 1
    assert stats["n_trainable_tokens"] > 0 and stats["failed"] == {}


def test_the_client_lists_created_sessions(client):
    info = client.create_session(metadata={"task": "t1"})
    listed = {s["session_id"]: s for s in client.list_sessions()}
    assert listed[info.session_id]["metadata"] == {"task": "t1"}


def test_a_session_id_can_be_chosen_but_not_reused(client):
    client.create_session(session_id="rollout-7")
    with pytest.raises(Exception, match="already exists"):
        client.create_session(session_id="rollout-7")



async def test_a_model_call_the_fast_dispatch_declines_is_served_by_the_route_table(fake):
    # CaptureApp answers model calls before Starlette's router; one it does not take (here: a
    # request under a root path) must reach the same handler through the route table.
    app = create_app(fake.url, admin_key="admin")
    transport = httpx.ASGITransport(app=app, root_path="/proxy")
    async with httpx.AsyncClient(transport=transport, base_url="http://capture/proxy") as http:
        created = (await http.post("/admin/sessions", json={},
                                   headers={"authorization": "Bearer admin"})).json()
        route = f"/s/{created['session_id']}/v1/chat/completions"
        key = {"authorization": f"Bearer {created['secret']}"}
        reply = await http.post(route, headers=key, json={
            "model": "m", "messages": [SYSTEM, {"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["message"]["role"] == "assistant"
        assert app.state.capture.store.get(created["session_id"]).n_calls == 1
        assert (await http.get(route, headers=key)).status_code == 405
    await app.state.capture.engines.aclose()


async def test_many_sessions_at_once_streamed_and_not_lose_no_call(client, fake):
    # Agents in parallel over the proxy's pooled engine connections. A connection handed to two
    # requests at once, or closed under one, shows here as a failed call, an error reply or a
    # broken chain; each session must end with exactly its own calls, all ok.
    fake.token_delay_s = 0.001  # streams overlap and interleave
    sessions = [client.create_session() for _ in range(48)]

    async def agent(http: httpx.AsyncClient, info, stream: bool) -> None:
        messages = [SYSTEM, {"role": "user", "content": "fix the bug"}]
        for turn in range(4):
            reply = await http.post(
                f"{info.base_urls['chat']}/chat/completions",
                headers={"authorization": f"Bearer {info.secret}"},
                json={"model": "m", "messages": messages, "tools": TOOLS, "stream": stream})
            assert reply.status_code == 200, reply.text
            if stream:
                assert reply.text.rstrip().endswith("data: [DONE]"), reply.text[-300:]
                message = streamed_message(reply.text)
            else:
                message = reply.json()["choices"][0]["message"]
            messages += [{k: message[k] for k in ("role", "content", "tool_calls") if k in message},
                         {"role": "tool", "tool_call_id": f"call_{turn}", "content": "ok"}]

    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(agent(http, info, i % 2 == 0) for i, info in enumerate(sessions)))
    for info in sessions:
        stats = client.stats(info.session_id)
        assert stats["failed"] == {}, stats
        assert stats["graph"]["n_turns"] == 4 and stats["graph"]["n_roots"] == 1, stats["graph"]


def streamed_message(text: str) -> dict:
    """The assistant message an agent rebuilds from a chat completion stream."""
    content, calls = [], {}
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        for choice in json.loads(line[6:]).get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"id": "", "type": "function",
                                                         "function": {"name": "", "arguments": ""}})
                call["id"] = piece.get("id") or call["id"]
                function = piece.get("function") or {}
                call["function"]["name"] += function.get("name") or ""
                call["function"]["arguments"] += function.get("arguments") or ""
    message: dict = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def test_a_step_past_the_step_limit_is_refused_unsent_and_unrecorded(fake, tmp_path):
    """A step is a call that offers tools. Past the session's step limit the proxy answers 403
    and the engine never sees the call, so an agent whose own limit is soft (opencode runs the
    tools of its wrap-up turn) cannot act past it however fast the engine answers. Side calls
    (no tools: titles, summaries) are not steps. The limit and the count survive a restart."""
    data_dir = tmp_path / "capture"
    with CaptureServer(fake.url, data_dir=data_dir) as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session(step_limit=1)
        messages = conversation(info, 1)  # the one step
        title = [{"role": "user", "content": "Generate a title"}]
        assert chat(info, title, tools=None).status_code == 200  # not a step
        seen = len(fake.requests)
        refused = chat(info, messages)
        assert refused.status_code == 403, refused.text
        assert "step limit" in refused.json()["error"]["message"]
        assert len(fake.requests) == seen  # never sent on
        stats = admin.stats(info.session_id)
        assert stats["steps"] == {"limit": 1, "taken": 1, "refused": 1}
        assert stats["n_calls"] == 2 and stats["n_failed"] == 0  # not recorded, not a failure
        unlimited = admin.create_session()
        conversation(unlimited, 3)
        assert admin.stats(unlimited.session_id)["steps"] == {
            "limit": None, "taken": 3, "refused": 0}
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as second:
        moved = info.__class__(info.session_id, info.secret, {
            k: v.replace(first.url, second.url) for k, v in info.base_urls.items()})
        assert chat(moved, messages).status_code == 403  # the restart did not reset the count
        admin = CaptureClient(second.url, second.admin_key)
        assert admin.stats(info.session_id)["steps"]["taken"] == 1


@pytest.mark.parametrize("limit", [0, -1, 1.5, "2", True])
def test_a_bad_step_limit_is_refused_when_the_session_is_created(proxy, limit):
    reply = httpx.post(f"{proxy.url}/admin/sessions", json={"step_limit": limit},
                       headers={"authorization": f"Bearer {proxy.admin_key}"}, timeout=30)
    assert reply.status_code == 400 and "step_limit" in reply.text
