"""Reasoning through each dialect: out to the agent in its own form, back to the engine as `reasoning`.

    .venv/bin/python -m pytest tests/test_dialects_reasoning.py -q

vLLM 0.32 renders an assistant message's `reasoning` (and calls `reasoning_content` deprecated,
renaming it only when `reasoning` is absent): every dialect forwards earlier reasoning under that
one name (capture/dialects/base.py ENGINE_REASONING_FIELD), so the request the proxy records is the
one the engine renders. The real engine's side is tests/test_thinking_engine.py.

    agent sends back                                  engine gets
    chat       message.reasoning / reasoning_content  message.reasoning
    responses  a `reasoning` item (content, encrypted_content or summary)
                                                      the next assistant message's reasoning
    messages   an assistant `thinking` block          the assistant message's reasoning
"""

from __future__ import annotations

import pytest

from capture.dialects import DIALECTS
from capture.dialects.base import ENGINE_REASONING_FIELD
from capture.dialects.responses_request import encode_reasoning

ENGINE_REPLY = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "tiny",
    "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "reasoning": "list first",
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]}}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
}


def assistant(chat: dict) -> dict:
    (message,) = [m for m in chat["messages"] if m["role"] == "assistant"]
    return message


def test_the_engine_field_is_vllms():
    assert ENGINE_REASONING_FIELD == "reasoning"


@pytest.mark.parametrize("sent", [{"reasoning_content": "plan"}, {"reasoning": "plan"},
                                  {"reasoning": "plan", "reasoning_content": "other"}])
def test_chat_sends_reasoning_back_under_the_name_vllm_renders(sent):
    body = {"model": "tiny", "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "ok", **sent},
        {"role": "user", "content": "next"}]}
    message = assistant(DIALECTS["chat"].to_chat(body))
    # with both names, `reasoning` wins, as in vLLM's own request validator
    assert message[ENGINE_REASONING_FIELD] == "plan" and "reasoning_content" not in message


def test_chat_reply_keeps_the_engines_reasoning_field():
    reply = DIALECTS["chat"].from_chat(ENGINE_REPLY, {"model": "tiny", "messages": []})
    assert reply["choices"][0]["message"]["reasoning"] == "list first"


@pytest.mark.parametrize("item", [
    {"type": "reasoning", "id": "rs_1", "summary": [],
     "content": [{"type": "reasoning_text", "text": "plan"}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": encode_reasoning("plan")},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "plan"}]},
])
def test_responses_reasoning_item_goes_back_as_the_assistant_turns_reasoning(item):
    body = {"model": "tiny", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]},
        item,
        {"type": "function_call", "call_id": "call_1", "name": "bash", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "out"}]}
    message = assistant(DIALECTS["responses"].to_chat(body))
    assert message[ENGINE_REASONING_FIELD] == "plan" and "reasoning_content" not in message
    assert message["tool_calls"][0]["function"]["name"] == "bash"


def test_responses_reply_carries_the_reasoning_as_a_reasoning_item():
    reply = DIALECTS["responses"].from_chat(ENGINE_REPLY, {"model": "tiny", "input": "q"})
    (item,) = [i for i in reply["output"] if i["type"] == "reasoning"]
    assert item["content"][0]["text"] == "list first"
    assert reply["output"].index(item) == 0  # before the function call it led to


def test_messages_thinking_block_goes_back_as_the_assistant_turns_reasoning():
    body = {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "plan", "signature": "sig"},
            {"type": "tool_use", "id": "call_1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                      "content": "out"}]}]}
    message = assistant(DIALECTS["messages"].to_chat(body))
    assert message[ENGINE_REASONING_FIELD] == "plan" and "reasoning_content" not in message


def test_messages_reply_carries_the_reasoning_as_a_thinking_block_first():
    reply = DIALECTS["messages"].from_chat(ENGINE_REPLY, {"model": "tiny", "max_tokens": 8,
                                                          "messages": []})
    assert reply["content"][0]["type"] == "thinking"
    assert reply["content"][0]["thinking"] == "list first"
    assert reply["content"][1]["type"] == "tool_use"
