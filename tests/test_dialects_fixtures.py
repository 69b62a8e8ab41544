"""Real request bodies from the four agent CLIs, translated: what each agent sent survives.

    .venv/bin/python -m pytest tests/test_dialects_fixtures.py -q

The fixtures under tests/fixtures/dialects/<agent>/ were recorded from opencode 1.x, Claude
Code 2.1, Codex 0.171 and mini-swe-agent 2.4 by tests/fixtures/dialects/record_agents.py
(re-run it after an agent upgrade). Each agent ran a full tool loop against our own dialects:
call 0 (or 1 for opencode, whose call 0 is its title generator) was answered with reasoning,
text and shell tool calls (two, one for mini-swe-agent), the next call carries the agent's
history with those calls, their results and the reasoning, as the agent sends them.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest

import capture.dialects as dialects_pkg
from capture.dialects import DIALECTS, Dialect
from tests.fixtures.dialects.fake_engine import engine_chunks, engine_reply
from tests.helpers.dialect_decode import decode_reply, decode_stream

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"
FILES = sorted(FIXTURES.glob("*/*.json"))
AGENTS = {"opencode": "chat", "claude": "messages", "codex": "responses", "mini": "chat"}
# (fixture with the history of the scripted tool turn, calls in that turn)
HISTORY = {"opencode": ("02_chat", 2), "claude": ("01_messages", 2),
           "codex": ("01_responses", 2), "mini": ("01_chat", 1)}
REASONING = "The user wants a greeting; run echo."


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def translate(name: str) -> tuple[dict, dict]:
    agent, stem = name.split("/")
    record = load(FIXTURES / agent / f"{stem}.json")
    return record, DIALECTS[record["dialect"]].to_chat(record["body"])


def test_every_agent_has_recorded_fixtures_for_its_dialect():
    for agent, dialect in AGENTS.items():
        records = [load(p) for p in (FIXTURES / agent).glob("*.json")]
        assert len(records) >= 2, f"record {agent}: tests/fixtures/dialects/record_agents.py"
        assert {r["dialect"] for r in records} == {dialect}


def test_fixtures_hold_no_api_key():
    for path in FILES:
        record = load(path)
        assert not {"authorization", "x-api-key"} & set(record["headers"])
        assert "fixture-key" not in path.read_text()


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_real_body_translates_to_a_chat_request(path):
    record = load(path)
    chat = DIALECTS[record["dialect"]].to_chat(record["body"])
    assert chat["messages"], "no messages"
    assert {m["role"] for m in chat["messages"]} <= {"system", "user", "assistant", "tool"}
    assert chat["max_tokens"] if record["dialect"] == "messages" else True
    assert chat.get("stream", False) == bool(record["body"].get("stream"))
    for tool in chat.get("tools", []):
        assert tool["type"] == "function" and tool["function"]["name"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_tool_result_answers_a_call_of_the_turn_before_it(path):
    record = load(path)
    chat = DIALECTS[record["dialect"]].to_chat(record["body"])
    calls: list[str] = []
    for message in chat["messages"]:
        if message["role"] == "assistant":
            calls = [c["id"] for c in message.get("tool_calls", [])]
        elif message["role"] == "tool":
            assert message["tool_call_id"] in calls
        else:
            calls = []


@pytest.mark.parametrize("agent", AGENTS)
def test_the_scripted_tool_turn_comes_back_whole(agent):
    stem, n_calls = HISTORY[agent]
    _, chat = translate(f"{agent}/{stem}")
    turns = [m for m in chat["messages"] if m.get("tool_calls")]
    assert len(turns) == 1
    turn = turns[0]
    assert turn["content"] == "Running the commands."
    assert turn["reasoning"] == REASONING
    ids = [c["id"] for c in turn["tool_calls"]]
    # fake_engine ids: chatcmpl-tool-<last 4 chars of the completion id><index>
    assert len(ids) == n_calls and all(i.startswith("chatcmpl-tool-") for i in ids)
    results = chat["messages"][chat["messages"].index(turn) + 1:][:n_calls]
    assert [r["tool_call_id"] for r in results] == ids  # in call order
    assert "hi" in results[0]["content"]


def test_claude_sends_results_in_reverse_and_we_restore_call_order():
    record, chat = translate("claude/01_messages")
    sent = [b["tool_use_id"] for b in record["body"]["messages"][-1]["content"]]
    ordered = [m["tool_call_id"] for m in chat["messages"] if m["role"] == "tool"]
    assert sent == ordered[::-1]


@pytest.mark.parametrize("agent, stem", [("claude", "00_messages"), ("codex", "00_responses"),
                                         ("opencode", "01_chat"), ("mini", "00_chat")])
def test_system_prompt_and_tools_survive(agent, stem):
    record, chat = translate(f"{agent}/{stem}")
    body = record["body"]
    system = chat["messages"][0]
    assert system["role"] == "system" and len(system["content"]) > 50
    names = [t["function"]["name"] for t in chat["tools"]]
    if agent == "claude":
        assert names == [t["name"] for t in body["tools"]]
        assert body["system"][1]["text"] in system["content"]
    elif agent == "codex":
        assert body["input"][0]["content"][0]["text"] == system["content"]
        declared = [t["name"] for t in body["tools"] if t["type"] == "function"]
        nested = [m["name"] for t in body["tools"] if t["type"] == "namespace"
                  for m in t["tools"]]
        assert sorted(names) == sorted(declared + nested)  # web_search dropped
    else:
        assert names == [t["function"]["name"] for t in body["tools"]]
        assert system == body["messages"][0]


def test_opencode_title_call_has_no_tools():
    _, chat = translate("opencode/00_chat")
    assert "tools" not in chat
    assert "title" in chat["messages"][0]["content"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_replies_to_real_bodies_round_trip_in_both_modes(path):
    """What the engine said (reasoning, text, two tool calls) is what the agent reads back, from
    the whole reply and from the stream assembled from its deltas."""
    record = load(path)
    dialect = DIALECTS[record["dialect"]]
    body = record["body"]
    said = ("weigh it", "Running two commands.",
            [("bash", {"command": "echo 'a \"b\"'"}), ("read", {"path": "/app/x", "n": 2})])
    reply = engine_reply(reasoning=said[0], content=said[1], tool_calls=said[2])
    assert decode_reply(record["dialect"], dialect.from_chat(reply, body)) == said
    encoder = dialect.stream_encoder(body)
    data = b"".join(encoder.on_chunk(c) for c in engine_chunks(reply)) + encoder.finish()
    assert decode_stream(record["dialect"], data) == said


def test_registry_names_match_their_dialects():
    assert set(DIALECTS) == {"chat", "responses", "messages"}
    for name, dialect in DIALECTS.items():
        assert isinstance(dialect, Dialect) and dialect.name == name


MODULES = ["base", "chat", "responses", "responses_items", "responses_request",
           "responses_stream", "messages", "messages_items", "messages_request",
           "messages_stream"]


@pytest.mark.parametrize("module", MODULES)
def test_module_exports_exactly_its_public_names(module):
    mod = importlib.import_module(f"capture.dialects.{module}")
    defined = {name for name, value in vars(mod).items()
               if not name.startswith("_") and getattr(value, "__module__", None) == mod.__name__
               and (inspect.isfunction(value) or inspect.isclass(value))}
    # every class and function defined here is exported, and every export exists
    assert defined <= set(mod.__all__) <= set(dir(mod))


def test_package_exports_the_contract():
    assert set(dialects_pkg.__all__) == {
        "DIALECTS", "ChatDialect", "Dialect", "DialectError", "MessagesDialect",
        "ResponsesDialect", "StreamEncoder"}
