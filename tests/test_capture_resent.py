"""Resent requests: read and written in O(what is new), and always what a full parse would give.

    .venv/bin/python -m pytest tests/test_capture_resent.py -q

The oracle is `orjson.loads` of the same bytes (and, for engine bodies, `loads(encode(chat))`
against `chat`): every read is compared with it, so a shortcut that changed one value, or took a
hostile insertion for an append, fails here. The counters say the shortcut was really taken.
"""

from __future__ import annotations

import copy
import json
import random

import orjson
import pytest

from capture.dialects import DIALECTS
from capture.dialects.memo import TranslationMemo
from capture.fake_engine import FakeEngine
from capture.resent import KEEP, EngineBodies, RequestReader
from capture.server import CaptureServer
from tests.helpers.conversations import chat_turns, messages_turns

SERIALISERS = {
    "compact (JS, Rust)": lambda body: json.dumps(body, separators=(",", ":"),
                                                  ensure_ascii=False).encode(),
    "spaced (Python SDKs)": lambda body: json.dumps(body).encode(),
    "indented": lambda body: json.dumps(body, indent=2).encode(),
}


def responses_turns(n: int) -> list[dict]:
    """Codex's shape: `input` items after `instructions`, tools after the list."""
    items: list[dict] = [{"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "fix it"}]}]
    bodies = []
    for turn in range(n):
        bodies.append({"model": "codex", "instructions": "you are Codex " * 20,
                       "input": copy.deepcopy(items), "tools": [
                           {"type": "function", "name": "shell", "parameters": {}}],
                       "stream": True})
        items += [{"type": "function_call", "call_id": f"c{turn}", "name": "shell",
                   "arguments": json.dumps({"command": ["ls", str(turn)]})},
                  {"type": "function_call_output", "call_id": f"c{turn}", "output": f"out {turn}"}]
    return bodies


def read_checked(reader: RequestReader, raw: bytes) -> dict:
    body = reader.read(raw)
    assert body == orjson.loads(raw)
    return body


@pytest.mark.parametrize("serialise", SERIALISERS.values(), ids=SERIALISERS.keys())
@pytest.mark.parametrize("turns", [chat_turns, messages_turns, responses_turns],
                         ids=["chat", "messages", "responses"])
def test_a_growing_conversation_is_parsed_in_full_twice_then_only_its_new_items(serialise, turns):
    reader = RequestReader()
    bodies = turns(12)
    for body in bodies:
        assert read_checked(reader, serialise(body)) == body
    # the first request, and the second (which teaches where the list ends), are parsed in full
    assert (reader.parsed, reader.appended) == (2, 10)


def test_the_items_read_are_the_earlier_requests_objects_so_the_memo_compare_is_by_pointer():
    reader = RequestReader()
    bodies = chat_turns(4)
    first, second, third = (reader.read(orjson.dumps(body)) for body in bodies[:3])
    assert all(a is b for a, b in zip(second["messages"], third["messages"], strict=False))
    third["messages"].append({"role": "user", "content": "mutating the returned list"})
    third["model"] = "changed"  # ... or dict is harmless: the reader keeps its own
    assert read_checked(reader, orjson.dumps(bodies[3]))["model"] == "m"
    assert reader.appended == 2


def test_an_edited_history_or_a_changed_field_is_parsed_in_full_and_learnt_again():
    reader = RequestReader()
    bodies = chat_turns(8)
    for body in bodies[:4]:
        read_checked(reader, orjson.dumps(body))
    edited = copy.deepcopy(bodies[4])
    edited["messages"][0]["content"] = "a compacted history"
    read_checked(reader, orjson.dumps(edited))
    changed = copy.deepcopy(bodies[5])
    changed["max_tokens"] = 99  # a field outside the list changed: the bytes after `]` differ
    read_checked(reader, orjson.dumps(changed))
    assert reader.parsed == 4 and reader.appended == 2
    changed_next = copy.deepcopy(bodies[6])
    changed_next["max_tokens"] = 99
    read_checked(reader, orjson.dumps(changed_next))  # learnt from the changed one: full parse
    changed_last = copy.deepcopy(bodies[7])
    changed_last["max_tokens"] = 99
    read_checked(reader, orjson.dumps(changed_last))
    assert reader.appended == 3


def test_a_retried_request_is_not_parsed_again_and_the_conversation_goes_on_the_short_way():
    reader = RequestReader()
    bodies = [orjson.dumps(body) for body in chat_turns(4)]
    for raw in (bodies[0], bodies[1], bodies[1], bodies[1], bodies[2], bodies[2], bodies[3]):
        read_checked(reader, raw)
    assert (reader.parsed, reader.repeated, reader.appended) == (2, 3, 2)


HOSTILE_INSERTIONS = {
    "closes the list and redefines it": b',{"role":"user","content":"x"}],"messages":[{"r":3}',
    "closes the list and adds a field": b',{"role":"user","content":"x"}],"extra":[1',
    "a trailing comma": b", ",
    "only whitespace": b"  ",
    "not JSON": b",{nope}",
    "an unterminated string": b',{"role":"user","content":"x}',
    "a bare value": b",1",
}


@pytest.mark.parametrize("inserted", HOSTILE_INSERTIONS.values(), ids=HOSTILE_INSERTIONS.keys())
def test_a_hostile_insertion_at_the_learnt_end_is_never_taken_for_an_append(inserted):
    reader = RequestReader()
    bodies = chat_turns(3)
    for body in bodies:
        read_checked(reader, orjson.dumps(body))
    last = orjson.dumps(bodies[-1])
    end = last.rindex(b"]", 0, last.index(b'"tools"'))  # the `]` closing messages
    raw = last[:end] + inserted + last[end:]
    appended = reader.appended
    try:
        expected = orjson.loads(raw)
    except orjson.JSONDecodeError:
        with pytest.raises(orjson.JSONDecodeError):
            reader.read(raw)
        return
    assert reader.read(raw) == expected
    if inserted == b",1":  # a value is a value: loads gives the same list, so it is an append
        assert reader.appended == appended + 1
    else:
        assert reader.appended == appended


def test_random_interleaved_conversations_always_read_as_the_full_parse():
    """Several conversations in one session, each growing, sometimes edited, reordered, or with a
    nested list ending where the learnt one did; every read equals orjson's."""
    for seed in range(40):
        rng = random.Random(seed)
        reader = RequestReader()
        conversations = [{"model": f"m{c}", "messages": [{"role": "system", "content": f"s{c}"}],
                          "tools": [{"type": "function", "function": {"name": "t"}}]}
                         for c in range(KEEP + 1)]
        # an agent keeps its serialiser; now and then one is swapped
        serialisers = [rng.choice(list(SERIALISERS.values())) for _ in conversations]
        for _ in range(60):
            c = rng.randrange(len(conversations))
            body = conversations[c]
            op = rng.random()
            if op < 0.6:
                for _ in range(rng.randint(1, 3)):
                    body["messages"].append(rng.choice([
                        {"role": "user", "content": f"u{rng.random()}"},
                        {"role": "user", "content": [{"type": "text", "text": "nested ]"}]},
                        {"role": "assistant", "content": None, "tool_calls": [
                            {"id": "c", "type": "function",
                             "function": {"name": "t", "arguments": "{\"a\": [1, 2]}"}}]},
                        {"role": "tool", "tool_call_id": "c", "content": "ok \\\"]"}]))
            elif op < 0.7:
                body["messages"][rng.randrange(len(body["messages"]))]["content"] = "edited"
            elif op < 0.8:
                body["messages"][-1] = {"role": "user", "content": [1, [2, [3]]]}
            elif op < 0.9:
                body["temperature"] = rng.choice([0, 0.5, 1, True, None])
            else:
                items = list(body.items())
                rng.shuffle(items)
                body.clear()
                body.update(items)
            if rng.random() < 0.05:
                serialisers[c] = rng.choice(list(SERIALISERS.values()))
            read_checked(reader, serialisers[c](body))
        assert reader.appended > 0


def test_a_non_object_body_is_returned_as_parsed_for_the_route_to_reject():
    reader = RequestReader()
    assert reader.read(b"[1, 2]") == [1, 2]
    with pytest.raises(orjson.JSONDecodeError):
        reader.read(b"{not json")


# --- the engine's side --------------------------------------------------------------------------
def engine_chat(messages: list, **extra) -> dict:
    return {"model": "tiny", "messages": messages, "tools": [{"type": "function", "function": {
        "name": "bash", "parameters": {"type": "object"}}}], "logprobs": True, "top_logprobs": 0,
        "return_token_ids": True, "temperature": 1.0, **extra}


def test_an_engine_body_that_extends_the_last_one_is_spliced_and_equals_the_full_json():
    bodies = EngineBodies()
    memo = TranslationMemo()
    for body in chat_turns(10):
        chat = DIALECTS["chat"].to_chat(copy.deepcopy(body), memo)
        chat.update(logprobs=True, top_logprobs=0, return_token_ids=True, temperature=1.0)
        assert orjson.loads(bodies.encode(chat)) == chat
    # with the memo, each call's first messages are the last call's objects: spliced
    assert (bodies.written, bodies.spliced) == (1, 9)


def test_an_engine_body_is_written_in_full_when_a_field_or_an_early_message_changed():
    bodies = EngineBodies()
    messages = [{"role": "user", "content": "a"}]
    first = engine_chat(messages)
    assert orjson.loads(bodies.encode(first)) == first
    grown = engine_chat([*messages, {"role": "assistant", "content": "b"}], temperature=0.5)
    assert orjson.loads(bodies.encode(grown)) == grown  # temperature changed
    copied = engine_chat([dict(m) for m in grown["messages"]] + [{"role": "user", "content": "c"}],
                         temperature=0.5)
    assert orjson.loads(bodies.encode(copied)) == copied  # equal messages, but new objects
    assert (bodies.written, bodies.spliced) == (3, 0)
    same = engine_chat([*copied["messages"], {"role": "user", "content": "d"}], temperature=0.5)
    assert orjson.loads(bodies.encode(same)) == same
    assert bodies.spliced == 1
    assert orjson.loads(bodies.encode({"model": "x"})) == {"model": "x"}  # no messages: as is


def test_a_proxied_session_reads_and_forwards_only_what_each_call_appends():
    """Through the running proxy: the engine receives exactly the agent's conversation, and the
    session's reader and writer took the short way on every call after the first two."""
    with FakeEngine() as fake, CaptureServer(fake.url) as proxy:
        import httpx

        from capture import CaptureClient

        with CaptureClient(proxy.url, proxy.admin_key) as admin:
            info = admin.create_session()
        messages = [{"role": "system", "content": "You are a coding agent. " * 40},
                    {"role": "user", "content": "fix the bug"}]
        tools = [{"type": "function", "function": {"name": "bash", "parameters": {}}}]
        for turn in range(6):
            reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=30,
                               headers={"authorization": f"Bearer {info.secret}"},
                               json={"model": "m", "messages": messages, "tools": tools})
            assert reply.status_code == 200, reply.text
            assert fake.requests[-1]["messages"] == messages
            assert fake.requests[-1]["tools"] == tools
            message = reply.json()["choices"][0]["message"]
            messages = [*messages, {k: message[k] for k in ("role", "content", "tool_calls")
                                    if k in message},
                        {"role": "tool", "tool_call_id": f"call_{turn}", "content": "ok"}]
        session = proxy.state.store.get(info.session_id)
        assert (session.reader.parsed, session.reader.appended) == (2, 4)
        # the second call's messages already come from the memo's first translations: spliced
        assert (session.engine_bodies.written, session.engine_bodies.spliced) == (1, 5)
