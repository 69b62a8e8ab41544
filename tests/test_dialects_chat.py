"""Chat Completions dialect: normalisation on the way in, engine fields stripped on the way out.

    .venv/bin/python -m pytest tests/test_dialects_chat.py -q
"""

from __future__ import annotations

import json

import pytest

from capture.dialects import DIALECTS, DialectError
from tests.fixtures.dialects.fake_engine import engine_chunks, engine_reply

chat = DIALECTS["chat"]

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run",
                                           "parameters": {"type": "object"}}}]


def body(**extra) -> dict:
    return {"model": "agent-model", "messages": [{"role": "user", "content": "hi"}], **extra}


def sse_payloads(data: bytes) -> list:
    out = []
    for block in data.decode().split("\n\n"):
        if block:
            assert block.startswith("data: "), block
            text = block[len("data: "):]
            out.append(text if text == "[DONE]" else json.loads(text))
    return out


def test_plain_request_passes_through_unchanged():
    request = body(tools=TOOLS, tool_choice="auto", temperature=0.3, max_tokens=50)
    assert chat.to_chat(request) == request


def test_to_chat_does_not_mutate_the_agent_body():
    request = body(tools=[], messages=[{"role": "developer", "content": "be brief"},
                                       {"role": "user", "content": "hi"}])
    snapshot = json.dumps(request)
    chat.to_chat(request)
    assert json.dumps(request) == snapshot


def test_empty_tools_are_dropped_with_their_tool_choice():
    out = chat.to_chat(body(tools=[], tool_choice="auto", parallel_tool_calls=True))
    assert "tools" not in out and "tool_choice" not in out and "parallel_tool_calls" not in out


def test_developer_role_becomes_system():
    out = chat.to_chat(body(messages=[{"role": "developer", "content": "rules"},
                                      {"role": "user", "content": "hi"}]))
    assert out["messages"][0] == {"role": "system", "content": "rules"}


def test_stream_options_without_stream_are_dropped():
    assert "stream_options" not in chat.to_chat(body(stream_options={"include_usage": True}))


def test_streaming_always_asks_the_engine_for_usage():
    out = chat.to_chat(body(stream=True))
    assert out["stream_options"] == {"include_usage": True}


def test_max_completion_tokens_becomes_max_tokens():
    out = chat.to_chat(body(max_completion_tokens=99))
    assert out["max_tokens"] == 99 and "max_completion_tokens" not in out


def test_legacy_functions_become_tools():
    fn = {"name": "bash", "parameters": {"type": "object"}}
    out = chat.to_chat(body(functions=[fn], function_call={"name": "bash"}))
    assert out["tools"] == [{"type": "function", "function": fn}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "bash"}}
    assert "functions" not in out and "function_call" not in out


def test_object_tool_arguments_become_a_json_string():
    call = {"id": "c1", "type": "function", "function": {"name": "bash",
                                                         "arguments": {"command": "ls"}}}
    out = chat.to_chat(body(messages=[{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": None,
                                       "tool_calls": [call]},
                                      {"role": "tool", "tool_call_id": "c1", "content": "x"}]))
    assert out["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"command": "ls"}'


@pytest.mark.parametrize("bad, where", [
    ({"messages": "hi"}, "messages must be an array"),
    ({"messages": []}, "messages must not be empty"),
    ({"messages": [3]}, "messages[0] must be an object"),
    ({"messages": [{"content": "x"}]}, "messages[0].role must be a string"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role 'robot'"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content must be"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"n": 2}, "n must be 1"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type 'web_search'"),
    ({"tools": "bash"}, "tools must be an array"),
    ({"stream": "yes"}, "stream must be a boolean"),
])
def test_malformed_requests_raise_dialect_error_naming_the_field(bad, where):
    request = {**body(), **bad}
    with pytest.raises(DialectError) as info:
        chat.to_chat(request)
    assert where in info.value.message
    assert info.value.status == 400


def test_body_that_is_not_an_object_is_a_dialect_error():
    with pytest.raises(DialectError, match="request body must be an object"):
        chat.to_chat([1, 2])


def test_reply_strips_engine_only_fields_and_logprobs():
    reply = engine_reply(content="hello")
    out = chat.from_chat(reply, body())
    assert "prompt_token_ids" not in out and "kv_transfer_params" not in out
    choice = out["choices"][0]
    assert "token_ids" not in choice and "logprobs" not in choice and "stop_reason" not in choice
    assert choice["message"]["content"] == "hello"
    assert choice["finish_reason"] == "stop"
    assert out["usage"] == reply["usage"]
    assert out["object"] == "chat.completion"


def test_reply_keeps_logprobs_when_the_agent_asked():
    out = chat.from_chat(engine_reply(content="x"), body(logprobs=True))
    assert out["choices"][0]["logprobs"]["content"][0]["logprob"] == -0.5


def test_reply_names_the_model_the_agent_asked_for():
    assert chat.from_chat(engine_reply(content="x"), body())["model"] == "agent-model"


def test_reply_does_not_mutate_the_engine_reply():
    reply = engine_reply(content="x")
    snapshot = json.dumps(reply)
    chat.from_chat(reply, body())
    assert json.dumps(reply) == snapshot


def test_reply_carries_every_tool_call():
    reply = engine_reply(tool_calls=[("bash", {"command": "ls"}), ("bash", {"command": "pwd"})])
    calls = chat.from_chat(reply, body(tools=TOOLS))["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ['{"command": "ls"}',
                                                           '{"command": "pwd"}']
    assert [c["id"] for c in calls] == [c["id"] for c in
                                        reply["choices"][0]["message"]["tool_calls"]]


def test_stream_passes_chunks_through_without_engine_fields():
    reply = engine_reply(content="hello", tool_calls=[("bash", {"command": "ls"})])
    request = body(stream=True, stream_options={"include_usage": True}, tools=TOOLS)
    encoder = chat.stream_encoder(request)
    data = b"".join(encoder.on_chunk(c) for c in engine_chunks(reply)) + encoder.finish()
    events = sse_payloads(data)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("prompt_token_ids" not in c for c in chunks)
    assert all("token_ids" not in ch and "logprobs" not in ch
               for c in chunks for ch in c["choices"])
    assert all(c["model"] == "agent-model" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == reply["usage"]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "hello"
    args = "".join(tc["function"].get("arguments", "") for c in chunks if c["choices"]
                   for tc in c["choices"][0]["delta"].get("tool_calls", []))
    assert args == '{"command": "ls"}'


def test_stream_hides_the_usage_chunk_the_agent_did_not_ask_for():
    encoder = chat.stream_encoder(body(stream=True))
    chunks = engine_chunks(engine_reply(content="hi"))
    events = sse_payloads(b"".join(encoder.on_chunk(c) for c in chunks))
    assert all(e["choices"] for e in events)
    assert all("usage" not in e for e in events)


def test_stream_failure_is_an_openai_error_payload_and_ends_the_stream():
    encoder = chat.stream_encoder(body(stream=True))
    encoder.on_chunk(engine_chunks(engine_reply(content="hi"))[0])
    failed = sse_payloads(encoder.fail("engine went away"))
    assert failed == [{"error": {"message": "engine went away", "type": "server_error",
                                 "param": None, "code": None}}]
    assert encoder.on_chunk(engine_chunks(engine_reply(content="hi"))[1]) == b""
    assert encoder.finish() == b""


def test_engine_error_chunk_becomes_the_stream_error():
    encoder = chat.stream_encoder(body(stream=True))
    events = sse_payloads(encoder.on_chunk({"error": {"message": "boom", "code": 500}}))
    assert events[0]["error"]["message"] == "boom"


@pytest.mark.parametrize("status, kind", [(400, "invalid_request_error"),
                                          (401, "authentication_error"),
                                          (429, "rate_limit_error"), (502, "server_error")])
def test_error_body_is_openai_shaped(status, kind):
    assert chat.error_body(status, "why") == {
        "error": {"message": "why", "type": kind, "param": None, "code": None}}


def test_chat_has_no_count_tokens_route():
    assert chat.count_tokens(body()) is None
