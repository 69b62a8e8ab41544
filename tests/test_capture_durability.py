"""The capture loses and reuses nothing (issue 15, item 5; capture/calllog.py, capture/sessions.py).

A proxy killed with SIGKILL while calls are in flight hands none of their node ids out again; a
torn or corrupt log line costs that line alone; the logs are fsynced by the stated policy; a
session whose folder remains cannot be created again (409).

    .venv/bin/python -m pytest tests/test_capture_durability.py -q
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from capture import calllog as calllog_module
from capture.calllog import CallLog, read_records
from capture.errors import (
    AgentDisconnected,
    EngineHTTPError,
    EngineNoTokenIds,
    EngineTimeout,
    EngineUnreachable,
)
from capture.sessions import ID_BLOCK, failure_kind
from tests.helpers.capture_client import chat, conversation
from tests.helpers.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]


def id_number(node_id: str) -> int:
    return int(node_id.rpartition(":")[2])


class ProxyProcess:
    """`python -m capture` in a child process, so it can be killed like a crash."""

    def __init__(self, engine_url: str, data_dir: Path, key_file: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "capture", "--engine-url", engine_url, "--port", "0",
             "--admin-key-file", str(key_file), "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.url = self.process.stdout.readline().split()[3]  # "capture proxy on URL -> ENGINE"
        self.admin = CaptureClient(self.url, key_file.read_text().strip())

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self.admin.close()


def test_node_ids_of_calls_in_flight_at_a_crash_are_never_handed_out_again(fake, tmp_path):
    data_dir, key_file = tmp_path / "data", tmp_path / "admin.key"
    first = ProxyProcess(fake.url, data_dir, key_file)
    try:
        info = first.admin.create_session()
        messages = conversation(info, 2, url=first.url)
        fake.fault = "hang"  # the next calls reach the engine and stay there
        seen = len(fake.requests)
        hung = [threading.Thread(target=lambda: _quietly(chat, info, messages, first.url),
                                 daemon=True) for _ in range(3)]
        for thread in hung:
            thread.start()
        wait_until(lambda: len(fake.requests) >= seen + 3, "three calls in flight at the engine")
    finally:
        first.kill()  # SIGKILL: no shutdown, no failed-call records for the three
    fake.fault = None
    second = ProxyProcess(fake.url, data_dir, key_file)
    try:
        handed_out = 2 + 3  # two recorded calls, three in flight at the crash
        conversation(info, 2, url=second.url, messages=messages)  # the agent goes on where it was
        turns = json.loads(second.admin.trace_json(info.session_id))["turns"]
        ids = [turn["node_id"] for turn in turns]
        assert len(ids) == len(set(ids)) == 4
        assert [id_number(i) for i in ids[:2]] == [1, 2]
        assert all(id_number(i) > handed_out for i in ids[2:]), ids
    finally:
        second.kill()


def _quietly(fn, *args) -> None:
    with contextlib.suppress(httpx.HTTPError):  # the proxy was killed under it: the point
        fn(*args)


def test_ids_are_reserved_in_durable_blocks_before_use(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(calllog_module.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    from capture.sessions import SessionStore

    store = SessionStore(tmp_path, fsync="interval")
    session = store.create()
    ids = [session.next_call_id() for _ in range(ID_BLOCK + 1)]
    records, _ = read_records(session.log_path)
    assert [r["upto"] for r in records if r["kind"] == "reserve"] == [ID_BLOCK, 2 * ID_BLOCK]
    assert len(synced) == 2  # each reservation was fsynced, under "interval" too
    assert len(set(ids)) == len(ids)
    store.close()
    again = SessionStore(tmp_path)
    assert again.recover() == 1
    assert id_number(again.get(session.session_id).next_call_id()) == 2 * ID_BLOCK + 1


def corrupt_lines(log: Path, *indices: int) -> None:
    """Replace the call lines of a log at `indices` (0 = its first call) with garbage."""
    lines = log.read_bytes().splitlines(keepends=True)
    calls = [i for i, line in enumerate(lines) if b'"kind":"call"' in line]
    for index in indices:
        lines[calls[index]] = b'{"kind": "call", "nod\x00\n'
    log.write_bytes(b"".join(lines))


def test_a_corrupt_line_in_the_middle_of_a_log_costs_that_line_alone(fake, tmp_path):
    data_dir = tmp_path / "capture"
    with CaptureServer(fake.url, data_dir=data_dir) as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session()
        conversation(info, 4)
        before = json.loads(admin.trace_json(info.session_id))["turns"]
    corrupt_lines(data_dir / "sessions" / info.session_id / "calls.jsonl", 1)  # the 2nd call
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as second:
        admin = CaptureClient(second.url, second.admin_key)
        stats = admin.stats(info.session_id)
        after = json.loads(admin.trace_json(info.session_id))["turns"]
    assert (stats["torn_log_lines"], stats["lost_calls"], stats["n_ok"]) == (1, 0, 4)
    assert [t["node_id"] for t in after] == [t["node_id"] for t in before]
    for old, new in zip(before, after, strict=True):  # every turn's tokens are kept
        assert (new["prompt_token_ids"], new["completion_token_ids"]) == (
            old["prompt_token_ids"], old["completion_token_ids"])
        assert new["metadata"]["parent_id"] == old["metadata"]["parent_id"]
    lost = after[1]  # its credit is what the line held: context only now, and it says why
    assert set(lost["loss_mask"]) == {0}
    assert lost["metadata"]["masked_logprobs"] == {
        "log_line_lost": len(lost["completion_token_ids"])}
    for old, new in zip(before[2:], after[2:], strict=True):  # the turns after it keep theirs
        assert (new["loss_mask"], new["per_token_logps"]) == (old["loss_mask"],
                                                              old["per_token_logps"])


def test_two_lost_lines_in_a_row_cost_the_calls_below_them_and_are_counted(fake, tmp_path):
    data_dir = tmp_path / "capture"
    with CaptureServer(fake.url, data_dir=data_dir) as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session()
        conversation(info, 4)
    log = data_dir / "sessions" / info.session_id / "calls.jsonl"
    corrupt_lines(log, 1, 2)
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as second:
        stats = CaptureClient(second.url, second.admin_key).stats(info.session_id)
    # calls 2 and 3 are lost; call 4's copy rebuilds call 3, whose own parent (call 2) is lost:
    # call 4 cannot be placed, and is counted; call 1 stands
    assert (stats["torn_log_lines"], stats["n_ok"], stats["lost_calls"]) == (2, 1, 1)


def test_calls_after_a_torn_last_line_are_not_fused_with_it(fake, tmp_path):
    data_dir = tmp_path / "capture"
    with CaptureServer(fake.url, data_dir=data_dir) as first:
        admin = CaptureClient(first.url, first.admin_key)
        info = admin.create_session()
        messages = conversation(info, 2)
    log = data_dir / "sessions" / info.session_id / "calls.jsonl"
    log.write_bytes(log.read_bytes() + b'{"kind": "call", "node_')  # crash mid-write
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as second:
        assert chat(info, messages, url=second.url).status_code == 200
    with CaptureServer(fake.url, data_dir=data_dir, admin_key=first.admin_key) as third:
        stats = CaptureClient(third.url, third.admin_key).stats(info.session_id)
    assert (stats["n_ok"], stats["torn_log_lines"], stats["lost_calls"]) == (3, 1, 0)


@pytest.mark.parametrize("policy", ["call", "interval", "never"])
def test_each_fsync_policy_syncs_as_stated(fake, tmp_path, monkeypatch, policy):
    synced = []
    real = os.fsync
    monkeypatch.setattr(calllog_module.os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    with CaptureServer(fake.url, data_dir=tmp_path / "d", fsync=policy,
                       fsync_interval_s=0.05) as proxy:
        admin = CaptureClient(proxy.url, proxy.admin_key)
        info = admin.create_session()
        conversation(info, 3)
        session = proxy.state.store.get(info.session_id)
        if policy == "call":  # the reservation, then one per call
            # A call is recorded (and synced) after its answer is sent: the last one may land
            # just after the client has its reply.
            wait_until(lambda: len(synced) >= 1 + 3 and not session.log.dirty,
                       "the third call's record to be fsynced", state=lambda: synced)
            assert len(synced) == 1 + 3
        elif policy == "interval":  # the reservation now, the calls by the next pass
            wait_until(lambda: len(synced) >= 2 and not session.log.dirty,
                       "the interval pass to fsync the session log", state=lambda: synced)
        else:
            assert synced == []
    records, torn = read_records(tmp_path / "d" / "sessions" / info.session_id / "calls.jsonl")
    assert torn == 0 and sum(r["kind"] == "call" for r in records) == 3


def test_an_unknown_fsync_policy_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="interval"):
        CallLog(tmp_path / "x", "sometimes")


def test_recreating_a_session_whose_folder_remains_is_a_409_naming_it(fake, tmp_path):
    data_dir = tmp_path / "capture"
    leftover = data_dir / "sessions" / "task-7"
    leftover.mkdir(parents=True)
    (leftover / "session.json").write_text("{torn")  # unreadable: not recovered at start-up
    with CaptureServer(fake.url, data_dir=data_dir) as proxy:
        reply = httpx.post(f"{proxy.url}/admin/sessions", json={"session_id": "task-7"},
                           headers={"authorization": f"Bearer {proxy.admin_key}"}, timeout=30)
        assert reply.status_code == 409, reply.text
        assert str(leftover) in reply.json()["error"]["message"]
        # a served session's id: 409 as well
        admin = CaptureClient(proxy.url, proxy.admin_key)
        admin.create_session(session_id="task-8")
        again = httpx.post(f"{proxy.url}/admin/sessions", json={"session_id": "task-8"},
                           headers={"authorization": f"Bearer {proxy.admin_key}"}, timeout=30)
        assert again.status_code == 409


@pytest.mark.parametrize(("error", "kind", "infra"), [
    (EngineTimeout("t"), "engine_timeout", True),
    (EngineUnreachable("u"), "engine_unreachable", True),
    (EngineNoTokenIds("prompt_token_ids"), "engine_no_token_ids", True),
    (EngineHTTPError(500, {"error": "x"}), "engine_http_error", True),
    (EngineHTTPError(429, {"error": "x"}), "engine_http_error", True),
    (EngineHTTPError(400, {"error": "too long"}), "engine_rejected", False),
    (AgentDisconnected("gone"), "agent_disconnected", False),
    (KeyError("a dialect bug"), "proxy_error", True),
])
def test_each_failure_has_one_kind_and_infra_is_what_the_agent_cannot_cause(error, kind, infra):
    from capture.sessions import INFRA_KINDS

    assert failure_kind(error) == kind and (kind in INFRA_KINDS) == infra


@pytest.mark.parametrize(("fault", "kind"), [
    ("http500", "engine_http_error"), ("hang", "engine_timeout"),
    ("disconnect:2", "engine_disconnected"), ("no_token_ids", "engine_no_token_ids")])
def test_failed_calls_are_counted_by_kind_in_the_stats(fake, fault, kind):
    with CaptureServer(fake.url, upstream_timeout_s=1.0) as proxy:
        admin = CaptureClient(proxy.url, proxy.admin_key)
        info = admin.create_session()
        assert chat(info, [{"role": "user", "content": "hi"}]).status_code == 200
        fake.fault = fault
        if fault.startswith("disconnect"):  # mid-stream: the agent already had its 200
            with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", timeout=60,
                              headers={"authorization": f"Bearer {info.secret}"},
                              json={"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                    "stream": True}) as reply:
                reply.read()
        else:
            assert chat(info, [{"role": "user", "content": "hi"}]).status_code >= 500
        stats = admin.stats(info.session_id)
    assert stats["failed_calls"] == {"total": 1, "infra": 1, "by_kind": {kind: 1}}
    assert stats["failures"][-1]["failure_kind"] == kind


def test_an_engine_that_is_down_before_the_call_is_a_counted_infra_failure():
    with CaptureServer("http://127.0.0.1:9") as proxy:  # nothing listens on port 9
        admin = CaptureClient(proxy.url, proxy.admin_key)
        info = admin.create_session()
        assert chat(info, [{"role": "user", "content": "hi"}]).status_code == 502
        stats = admin.stats(info.session_id)
    assert stats["failed_calls"] == {"total": 1, "infra": 1,
                                     "by_kind": {"engine_unreachable": 1}}
