"""An exported trace reads the same through TRL's own harness readers and ours.

    .venv/bin/python -m pytest tests/test_capture_trace_readers.py -q

TRL 1.16's `HarnessRolloutWorker` reads a trace with three helpers: tool calls from each turn's
`response.choices[0].message`, the transcript and tool failures from the last turn's
`request.messages`. The export writes that shape (capture/export.py) while storing each message
once; these tests run a real proxy (in front of the in-package fake engine), export, and hand the
result to TRL's functions, to `harness.shared.outcome.build_outcome`, and to the trainer's reader.
"""

from __future__ import annotations

import importlib
import os

import httpx
import pytest
from openenv.core.harness.training import TrainingTrace

from capture import CaptureClient, CaptureServer
from capture.fake_engine import FakeEngine
from harness.shared.outcome import build_outcome
from tests.helpers.tools import BASH_TOOLS as TOOLS
from trainer.rollouts import _tool_counts

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
trl_harness = importlib.import_module("trl.experimental.async_grpo.openenv_harness")


RESULTS = ["3 files", "Traceback (most recent call last): boom", "ok", "done"]


def agent_loop(info) -> list[dict]:
    """Four tool turns, one result a failure; returns the messages the last call sent."""
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": "fix the bug"}]
    sent: list[dict] = []
    for turn, result in enumerate(RESULTS):
        sent = list(messages)
        reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=30,
                           headers={"authorization": f"Bearer {info.secret}"},
                           json={"model": "m", "messages": messages, "tools": TOOLS})
        assert reply.status_code == 200, reply.text
        message = reply.json()["choices"][0]["message"]
        messages += [{k: message[k] for k in ("role", "content", "tool_calls") if k in message},
                     {"role": "tool", "tool_call_id": f"call_{turn}", "content": result}]
    return sent


@pytest.fixture
def recorded(tmp_path):
    with (FakeEngine() as fake,
          CaptureServer(fake.url, data_dir=tmp_path / "capture") as proxy,
          CaptureClient(proxy.url, proxy.admin_key) as admin):
        info = admin.create_session()
        sent = agent_loop(info)
        trace = TrainingTrace.model_validate_json(admin.trace_json(info.session_id))
    return trace, sent, fake.url, tmp_path / "capture", info.session_id


def test_trl_counts_the_tool_calls_and_failures_of_an_exported_trace(recorded):
    trace, _, _, _, _ = recorded
    entries = trace.to_trace_entries()
    assert len(entries) == len(RESULTS)
    assert trl_harness._tool_call_counts_by_name(entries) == {"bash": len(RESULTS)}
    # TRL estimates from the last request's results; the last call had not seen its own result
    assert trl_harness._tool_failures_by_name(entries) == {"bash": 1}


def test_the_last_turn_carries_the_whole_transcript_and_inner_turns_only_their_new_messages(
        recorded):
    trace, sent, _, _, _ = recorded
    *inner, last = trace.turns
    assert [m["content"] for m in last.request["messages"]] == [m["content"] for m in sent]
    assert all("messages" not in turn.request for turn in inner)
    stored = sum(len(turn.request["new_messages"]) for turn in trace.turns)
    assert stored == len(sent) - (len(RESULTS) - 1)  # each message once; replies are responses
    completion = trl_harness._messages_from_trace(trace.to_trace_entries())
    assert [m["role"] for m in completion] == [m["role"] for m in sent] + ["assistant"]


def test_our_outcome_and_the_trainer_reader_agree_with_trl(recorded):
    trace, sent, _, _, _ = recorded
    outcome = build_outcome(trace, env_reward=1.0, timed_out=False)
    entries = trace.to_trace_entries()
    assert outcome.tool_calls_by_name == trl_harness._tool_call_counts_by_name(entries)
    assert outcome.tool_failure_count == 1
    assert [m["role"] for m in outcome.completion] == [m["role"] for m in sent] + ["assistant"]
    by_name, failures = _tool_counts(entries)
    assert (by_name, failures) == ({"bash": len(RESULTS)}, 1)


def test_after_a_restart_the_last_turn_transcript_is_rebuilt_from_the_log(recorded):
    trace, _, engine_url, data_dir, session_id = recorded
    with (CaptureServer(engine_url, data_dir=data_dir) as proxy,
          CaptureClient(proxy.url, proxy.admin_key) as admin):
        again = TrainingTrace.model_validate_json(admin.trace_json(session_id))
    before, after = trace.turns[-1].request["messages"], again.turns[-1].request["messages"]
    assert [(m["role"], m.get("content")) for m in after] == [
        (m["role"], m.get("content")) for m in before]
    assert [t.response for t in again.turns] == [t.response for t in trace.turns]
