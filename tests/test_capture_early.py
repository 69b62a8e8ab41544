"""The engine request sent ahead of the full translation (capture/early.py).

The unit tests drive a session's real pipeline (reader, chat dialect with its memo, policy,
engine-body writer) call by call and check that the body known ahead is, byte for byte, what the
full path writes, whenever there is one. The proxy tests run behind the in-package fake engine:
what the engine receives, the agent's answer, the mismatch and refusal paths. The real engine's
token fidelity with early sends is in test_capture_engine.py.

Run: .venv/bin/python -m pytest tests/test_capture_early.py -q
"""

from __future__ import annotations

import random

import orjson
import pytest

from capture.dialects import DIALECTS
from capture.resent import EngineBodies
from capture.sampling import SamplingPolicy
from capture.sessions import Session
from capture.upstream import loads
from tests.helpers.chat_agent import SYSTEM, TOOLS, agent_loop, post, step

CHAT = DIALECTS["chat"]
TRANSLATE = CHAT.message_translator()

def full_path(session: Session, raw: bytes) -> bytes:
    """What the proxy's full path writes to the engine for `raw` (and remembers for next time)."""
    body = session.reader.read(raw)
    chat = CHAT.to_chat(body, session.memo)
    session.policy.enforce(chat)
    chat.update(logprobs=True, top_logprobs=0, return_token_ids=True, model="served")
    engine_body = session.engine_bodies.encode(chat)
    session.early.remember(raw, session.reader.growing(raw), engine_body, bool(chat.get("stream")))
    return engine_body


def new_session() -> Session:
    return Session("s", "k", SamplingPolicy.from_dict({"temperature": 1.0}))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("indent", [False, True])
def test_the_body_sent_ahead_is_byte_for_byte_the_full_translation(seed, indent):
    """Random interleaved conversations (a main thread, a side one), growing by appends, with
    spacing from an indenting serialiser or none: wherever a body is known ahead, it equals the
    full path's, and from a conversation's third call on one always is."""
    rng = random.Random(seed)
    session = new_session()
    conversations = {name: [SYSTEM, {"role": "user", "content": f"task {name}"}]
                     for name in ("main", "side")}
    calls = {name: 0 for name in conversations}
    ahead_count = 0
    for turn in range(40):
        name = "main" if rng.random() < 0.7 else "side"
        body = {"model": "m", "messages": conversations[name], "tools": TOOLS}
        raw = orjson.dumps(body, option=orjson.OPT_INDENT_2 if indent else 0)
        ahead = session.early.body_for(raw, TRANSLATE)
        written = full_path(session, raw)
        if ahead is not None:
            ahead_count += 1
            assert ahead == (written, False)
            assert loads(ahead[0]) == loads(written)
        elif calls[name] >= 2:
            pytest.fail(f"call {calls[name]} of conversation {name} had no body ahead")
        calls[name] += 1
        conversations[name] = conversations[name] + step(turn, rng)
    assert ahead_count >= 25


def test_anything_but_an_append_to_a_remembered_call_has_no_body_ahead():
    session = new_session()
    messages = [SYSTEM, {"role": "user", "content": "fix it"}]
    rng = random.Random(0)
    for turn in range(3):  # learn the conversation
        full_path(session, orjson.dumps({"messages": messages, "tools": TOOLS}))
        messages = messages + step(turn, rng)
    last = orjson.dumps({"messages": messages, "tools": TOOLS})
    assert session.early.body_for(last, TRANSLATE) is not None
    full_path(session, last)
    _, end, _ = session.reader.growing(last)  # where the next messages would go
    cases = {
        "the same call again": last,
        "an edited history": orjson.dumps({"messages": [SYSTEM, {"role": "user", "content": "x"},
                                                        *messages[2:]], "tools": TOOLS}),
        "a changed field": orjson.dumps({"messages": messages + step(9, rng), "tools": TOOLS,
                                         "temperature": 0.5}),
        "a message the dialect refuses": orjson.dumps({"messages": messages + [
            {"role": "wizard", "content": "hi"}], "tools": TOOLS}),
        "a tool call without a name": orjson.dumps({"messages": messages + [
            {"role": "assistant", "tool_calls": [{"function": {}}]}], "tools": TOOLS}),
        "not JSON where the items go": last[:end] + b",{oops" + last[end:],
    }
    for why, raw in cases.items():
        assert session.early.body_for(raw, TRANSLATE) is None, why


# --- through the proxy -----------------------------------------------------------------------
@pytest.mark.parametrize("streamed", [False, True])
def test_an_agent_loop_is_sent_ahead_from_its_third_call_and_the_engine_gets_the_same_request(
        client, fake, streamed):
    info = client.create_session(sampling={"temperature": 0.7, "max_tokens": 64})
    agent_loop(info, 6, streamed)
    stats = client.stats(info.session_id)
    assert stats["early"] == {"sent": 4, "mismatched": 0}
    assert stats["n_ok"] == 6 and stats["graph"]["n_roots"] == 1
    last = fake.requests[-1]  # what the engine parsed from the body sent ahead
    assert len(last["messages"]) == 2 + 2 * 5
    assert last["temperature"] == 0.7 and last["max_tokens"] == 64  # the policy, enforced
    assert last["logprobs"] is True and last["return_token_ids"] is True
    assert bool(last.get("stream")) is streamed


def test_a_body_sent_ahead_that_the_full_path_disagrees_with_is_cancelled_and_sent_again(
        client, fake, monkeypatch):
    """The check that keeps early sends safe: if the full translation writes another body (here
    one it is made to), the engine's reply to the early body is not used; the full path's body
    is sent, its reply is the agent's, and the mismatch is counted."""
    info = client.create_session()
    messages = agent_loop(info, 3)
    encode = EngineBodies.encode
    monkeypatch.setattr(EngineBodies, "encode",
                        lambda self, chat: encode(self, {**chat, "max_tokens": 7}))
    seen = len(fake.requests)
    reply = post(info, messages)
    assert reply.status_code == 200, reply.text
    assert client.stats(info.session_id)["early"] == {"sent": 2, "mismatched": 1}
    assert fake.requests[-1]["max_tokens"] == 7  # the full path's body was the one answered
    assert len(fake.requests) in (seen + 1, seen + 2)  # the early one, if it got there first
    assert client.stats(info.session_id)["n_ok"] == 4


def test_a_call_that_fails_translation_never_reaches_the_engine(client, fake):
    info = client.create_session()
    messages = agent_loop(info, 3)
    seen = len(fake.requests)
    reply = post(info, [*messages, {"role": "wizard", "content": "hi"}])
    assert reply.status_code == 400
    assert "messages[8].role" in reply.json()["error"]["message"]
    assert len(fake.requests) == seen
    assert client.stats(info.session_id)["early"]["sent"] == 1


def test_an_engine_failure_on_a_body_sent_ahead_is_the_agents_error_in_its_dialect(client, fake):
    info = client.create_session()
    messages = agent_loop(info, 3)
    fake.fault = "http500"
    reply = post(info, messages)
    assert reply.status_code == 502
    assert reply.json()["error"]["type"] == "server_error"
    stats = client.stats(info.session_id)
    assert stats["early"]["sent"] == 2 and stats["n_failed"] == 1
    assert stats["failures"][-1]["cause"] == "EngineHTTPError"


def test_after_a_lora_push_no_body_naming_the_old_adapter_is_sent_ahead(client, fake):
    """LoRA runs name the adapter per version (capture.state.engine_model): a body remembered
    under adapter 1 is never sent ahead once the proxy names adapter 2, so the switch costs no
    cancelled engine request, and every call after it reaches adapter 2."""
    from tests.helpers.chat_agent import post

    info = client.create_session(sampling={"temperature": 0.7, "max_tokens": 64})
    client.set_weight_version(1, "tiny-lora-v1")
    messages = agent_loop(info, 3)
    assert client.stats(info.session_id)["early"] == {"sent": 1, "mismatched": 0}
    client.set_weight_version(2, "tiny-lora-v2")
    for turn in (3, 4):
        reply = post(info, messages)
        assert reply.status_code == 200, reply.text
        assert fake.requests[-1]["model"] == "tiny-lora-v2"
        message = reply.json()["choices"][0]["message"]
        messages = messages + [
            {k: message[k] for k in ("role", "content", "tool_calls") if k in message},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"out {turn}"}]
    # the first call after the switch takes the full path; the next is sent ahead again
    assert client.stats(info.session_id)["early"] == {"sent": 2, "mismatched": 0}
