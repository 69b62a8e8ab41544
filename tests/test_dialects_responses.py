"""Responses dialect (Codex): items <-> chat messages, reply shape, SSE event order.

    .venv/bin/python -m pytest tests/test_dialects_responses.py -q
"""

from __future__ import annotations

import json

import pytest

from capture.dialects import DIALECTS, DialectError
from tests.fixtures.dialects.fake_engine import engine_chunks, engine_reply

responses = DIALECTS["responses"]

SHELL = {"type": "function", "name": "exec_command", "description": "run a command",
         "strict": False, "parameters": {"type": "object",
                                         "properties": {"cmd": {"type": "string"}}}}
NAMESPACE = {"type": "namespace", "name": "agents", "description": "sub-agents",
             "tools": [{"type": "function", "name": "spawn_agent",
                        "parameters": {"type": "object", "properties": {}}}]}
PATCH = {"type": "custom", "name": "apply_patch", "description": "patch files",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}


def request(input_items, **extra) -> dict:
    return {"model": "gpt-test", "instructions": "You are Codex.", "input": input_items,
            "tools": [SHELL, NAMESPACE, PATCH, {"type": "local_shell"},
                      {"type": "web_search", "external_web_access": True}],
            "tool_choice": "auto", "parallel_tool_calls": True, "stream": True,
            "store": False, **extra}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def events_of(data: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        head, data_line = block.split("\n")
        name = head.removeprefix("event: ")
        payload = json.loads(data_line.removeprefix("data: "))
        assert payload["type"] == name
        out.append((name, payload))
    assert [p["sequence_number"] for _, p in out] == list(range(len(out)))
    return out


def stream(reply: dict, req: dict) -> list[tuple[str, dict]]:
    encoder = responses.stream_encoder(req)
    data = b"".join(encoder.on_chunk(c) for c in engine_chunks(reply)) + encoder.finish()
    return events_of(data)


# --- request ---------------------------------------------------------------------------------


def test_instructions_and_developer_messages_become_system_messages():
    out = responses.to_chat(request([
        {"type": "message", "role": "developer",
         "content": [{"type": "input_text", "text": "rules"}]}, user("hi")]))
    assert out["messages"][:3] == [{"role": "system", "content": "You are Codex."},
                                   {"role": "system", "content": "rules"},
                                   {"role": "user", "content": "hi"}]


def test_empty_instructions_add_no_system_message():
    out = responses.to_chat({"model": "m", "instructions": "", "input": "hello"})
    assert out["messages"] == [{"role": "user", "content": "hello"}]


def test_string_input_is_one_user_message():
    out = responses.to_chat({"model": "m", "input": "hello"})
    assert out["messages"] == [{"role": "user", "content": "hello"}]


def test_reasoning_text_and_calls_regroup_into_one_assistant_message():
    out = responses.to_chat(request([
        user("hi"),
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
         "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Running."}]},
        {"type": "function_call", "call_id": "c1", "name": "exec_command",
         "arguments": '{"cmd": "ls"}'},
        {"type": "function_call", "call_id": "c2", "name": "exec_command",
         "arguments": '{"cmd": "pwd"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        {"type": "function_call_output", "call_id": "c2", "output": "/w"},
    ]))
    assert out["messages"][2:] == [
        {"role": "assistant", "content": "Running.", "reasoning": "think",
         "tool_calls": [
             {"id": "c1", "type": "function",
              "function": {"name": "exec_command", "arguments": '{"cmd": "ls"}'}},
             {"id": "c2", "type": "function",
              "function": {"name": "exec_command", "arguments": '{"cmd": "pwd"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "/w"},
    ]


def test_tool_outputs_are_put_in_call_order():
    out = responses.to_chat(request([
        user("hi"),
        {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "second"},
        {"type": "function_call_output", "call_id": "c1", "output": "first"},
    ]))
    assert [m["content"] for m in out["messages"][-2:]] == ["first", "second"]


def test_reasoning_we_encrypted_comes_back_verbatim():
    reply = responses.from_chat(engine_reply(reasoning="deep thought", content="ok"),
                                request([user("hi")]))
    item = reply["output"][0]
    out = responses.to_chat(request([user("hi"), {**item, "content": None}]))
    assert out["messages"][-1]["reasoning"] == "deep thought"


def test_tools_map_to_chat_functions_and_hosted_tools_are_dropped():
    out = responses.to_chat(request([user("hi")]))
    names = [t["function"]["name"] for t in out["tools"]]
    assert names == ["exec_command", "spawn_agent", "apply_patch", "local_shell"]
    assert out["tools"][0]["function"] == {
        "name": "exec_command", "description": "run a command", "strict": False,
        "parameters": SHELL["parameters"]}
    patch = out["tools"][2]["function"]
    assert patch["parameters"]["required"] == ["input"]
    assert "start: /.+/" in patch["description"]
    assert out["tool_choice"] == "auto" and out["parallel_tool_calls"] is True


def test_namespace_name_that_collides_is_prefixed_both_ways():
    clash = {"type": "namespace", "name": "ns", "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]}
    req = request([user("hi"), {"type": "function_call", "call_id": "c1", "namespace": "ns",
                                "name": "exec_command", "arguments": "{}"}],
                  tools=[SHELL, clash])
    out = responses.to_chat(req)
    assert [t["function"]["name"] for t in out["tools"]] == ["exec_command", "ns__exec_command"]
    assert out["messages"][-1]["tool_calls"][0]["function"]["name"] == "ns__exec_command"
    reply = responses.from_chat(engine_reply(tool_calls=[("ns__exec_command", {})]), req)
    assert reply["output"][0]["name"] == "exec_command"
    assert reply["output"][0]["namespace"] == "ns"


def test_custom_and_local_shell_calls_in_history_become_chat_calls():
    out = responses.to_chat(request([
        user("hi"),
        {"type": "custom_tool_call", "call_id": "p1", "name": "apply_patch", "input": "*** x"},
        {"type": "custom_tool_call_output", "call_id": "p1", "output": "done"},
        {"type": "local_shell_call", "call_id": "s1", "status": "completed",
         "action": {"type": "exec", "command": ["ls", "-l"], "working_directory": "/w"}},
        {"type": "local_shell_call_output", "call_id": "s1", "output": "x"},
    ]))
    calls = [m["tool_calls"][0]["function"] for m in out["messages"] if m.get("tool_calls")]
    assert calls == [{"name": "apply_patch", "arguments": '{"input": "*** x"}'},
                     {"name": "local_shell",
                      "arguments": '{"command": ["ls", "-l"], "workdir": "/w"}'}]


def test_max_output_tokens_and_streaming_options_translate():
    out = responses.to_chat(request([user("hi")], max_output_tokens=64, temperature=0.5))
    assert out["max_tokens"] == 64 and out["temperature"] == 0.5
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("change, where", [
    ({"input": 5}, "input must be an array"),
    ({"input": [], "instructions": None}, "input must not be empty"),
    ({"input": ["hi"]}, "input[0] must be an object"),
    ({"input": [{"type": "message", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_file"}]}]},
     "input[0].content[0].type 'input_file'"),
    ({"input": [{"type": "function_call", "name": "x", "arguments": "{}"}]},
     "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "item_reference"),
    ({"input": [{"type": "mystery"}]}, "input[0].type 'mystery'"),
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "function"}]}, "tools[0].name must be a string"),
    ({"tools": [{"type": "computer_use_magic"}]}, "tools[0].type"),
    ({"tool_choice": 7}, "tool_choice 7"),
    ({"max_output_tokens": "lots"}, "max_output_tokens must be an integer"),
    ({"temperature": "hot"}, "temperature must be"),
])
def test_malformed_requests_raise_dialect_error_naming_the_field(change, where):
    with pytest.raises(DialectError) as info:
        responses.to_chat({**request([user("hi")]), **change})
    assert where in info.value.message


# --- non-streaming reply ---------------------------------------------------------------------


def test_reply_has_reasoning_message_and_calls_in_order():
    req = request([user("hi")])
    reply = engine_reply(reasoning="plan", content="Running.", chat_id="chatcmpl-abc",
                         tool_calls=[("exec_command", {"cmd": "ls"}),
                                     ("exec_command", {"cmd": "pwd"})])
    out = responses.from_chat(reply, req)
    assert out["id"] == "resp_abc" and out["object"] == "response"
    assert out["status"] == "completed" and out["incomplete_details"] is None
    assert out["model"] == "gpt-test" and out["created_at"] == reply["created"]
    reasoning, message, call1, call2 = out["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["summary"] == [{"type": "summary_text", "text": "plan"}]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "plan"}]
    assert message == {"type": "message", "id": "msg_abc_1", "status": "completed",
                       "role": "assistant", "content": [
                           {"type": "output_text", "text": "Running.", "annotations": [],
                            "logprobs": []}]}
    engine_calls = reply["choices"][0]["message"]["tool_calls"]
    assert call1 == {"type": "function_call", "id": "fc_abc_0",
                     "call_id": engine_calls[0]["id"], "name": "exec_command",
                     "arguments": '{"cmd": "ls"}', "status": "completed"}
    assert call2["call_id"] == engine_calls[1]["id"]
    usage = reply["usage"]
    assert out["usage"] == {"input_tokens": usage["prompt_tokens"],
                            "input_tokens_details": {"cached_tokens": 0},
                            "output_tokens": usage["completion_tokens"],
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]}


def test_reply_cut_at_the_agents_own_limit_is_incomplete():
    reply = engine_reply(content="abc", finish_reason="length")
    limit = reply["usage"]["completion_tokens"]
    out = responses.from_chat(reply, request([user("hi")], max_output_tokens=limit))
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}


def test_reply_cut_by_the_proxy_cap_is_completed():
    # Codex sets no max_output_tokens; the stop came from the session's cap.
    out = responses.from_chat(engine_reply(content="abc", finish_reason="length"),
                              request([user("hi")]))
    assert out["status"] == "completed" and out["incomplete_details"] is None


def test_custom_and_local_shell_calls_come_back_in_their_own_item_types():
    req = request([user("hi")])
    out = responses.from_chat(engine_reply(tool_calls=[
        ("apply_patch", {"input": "*** Begin Patch"}),
        ("local_shell", {"command": ["ls"], "workdir": "/w", "timeout_ms": 5})]), req)
    patch, shell = out["output"]
    assert patch["type"] == "custom_tool_call" and patch["name"] == "apply_patch"
    assert patch["input"] == "*** Begin Patch"
    assert shell["type"] == "local_shell_call"
    assert shell["action"] == {"type": "exec", "command": ["ls"], "env": {},
                               "working_directory": "/w", "timeout_ms": 5}


def test_namespaced_tool_call_names_its_namespace():
    out = responses.from_chat(engine_reply(tool_calls=[("spawn_agent", {})]),
                              request([user("hi")]))
    assert out["output"][0]["namespace"] == "agents"
    assert out["output"][0]["name"] == "spawn_agent"


def test_error_body_is_openai_shaped():
    assert responses.error_body(404, "gone")["error"]["type"] == "not_found_error"


# --- streaming -------------------------------------------------------------------------------


def test_stream_event_order_for_reasoning_text_and_two_calls():
    req = request([user("hi")])
    reply = engine_reply(reasoning="plan", content="Running.", chat_id="chatcmpl-abc",
                         tool_calls=[("exec_command", {"cmd": "ls"}),
                                     ("exec_command", {"cmd": "pwd"})])
    names = [name for name, _ in stream(reply, req)]
    call = ["response.output_item.added", "response.function_call_arguments.delta",
            "response.function_call_arguments.delta", "response.function_call_arguments.done",
            "response.output_item.done"]
    assert names == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        *call, *call,
        "response.completed"]


def test_stream_completed_event_matches_the_non_streaming_reply():
    req = request([user("hi")])
    reply = engine_reply(reasoning="plan", content="Running.", chat_id="chatcmpl-abc",
                         tool_calls=[("exec_command", {"cmd": "ls"}), ("apply_patch",
                                                                      {"input": "p"})])
    completed = stream(reply, req)[-1][1]["response"]
    expected = responses.from_chat(reply, req)
    # streams leave out the echo of the (large) instructions and tools
    assert completed == {**expected, "instructions": None, "tools": []}


def test_stream_items_are_indexed_in_order_and_deltas_add_up():
    req = request([user("hi")])
    reply = engine_reply(content="Hello there", tool_calls=[("exec_command", {"cmd": "ls"})])
    events = stream(reply, req)
    done = [p for n, p in events if n == "response.output_item.done"]
    assert [p["output_index"] for p in done] == [0, 1]
    text = "".join(p["delta"] for n, p in events if n == "response.output_text.delta")
    args = "".join(p["delta"] for n, p in events
                   if n == "response.function_call_arguments.delta")
    assert text == "Hello there" and args == '{"cmd": "ls"}'
    added = [p["item"] for n, p in events if n == "response.output_item.added"]
    assert added[1]["arguments"] == "" and added[1]["status"] == "in_progress"


def test_stream_custom_tool_call_arrives_whole():
    events = stream(engine_reply(tool_calls=[("apply_patch", {"input": "*** P"})]),
                    request([user("hi")]))
    names = [n for n, _ in events]
    assert names[2:] == ["response.output_item.added", "response.custom_tool_call_input.delta",
                         "response.custom_tool_call_input.done", "response.output_item.done",
                         "response.completed"]
    assert events[3][1]["delta"] == "*** P"


def test_stream_cut_at_the_agents_own_limit_ends_with_response_incomplete():
    reply = engine_reply(content="abc", finish_reason="length")
    req = request([user("hi")], max_output_tokens=reply["usage"]["completion_tokens"])
    events = stream(reply, req)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_stream_usage_comes_from_the_engine_usage_chunk():
    reply = engine_reply(content="abc", prompt_tokens=11)
    usage = stream(reply, request([user("hi")]))[-1][1]["response"]["usage"]
    assert usage["input_tokens"] == 11
    assert usage["output_tokens"] == reply["usage"]["completion_tokens"]


def test_stream_without_usage_chunk_counts_engine_tokens():
    reply = engine_reply(content="abcdef", prompt_tokens=9)
    encoder = responses.stream_encoder(request([user("hi")]))
    data = b"".join(encoder.on_chunk(c) for c in engine_chunks(reply, usage=False))
    usage = events_of(data + encoder.finish())[-1][1]["response"]["usage"]
    # engine_chunks: two content chunks and the finish chunk carry one token id each
    assert usage["input_tokens"] == 9 and usage["output_tokens"] == 3


def test_stream_failure_sends_error_then_response_failed():
    encoder = responses.stream_encoder(request([user("hi")]))
    first = encoder.on_chunk(engine_chunks(engine_reply(content="abc"))[0])
    events = events_of(first + encoder.fail("engine died"))
    assert [n for n, _ in events][-2:] == ["error", "response.failed"]
    assert events[-2][1]["message"] == "engine died"
    assert events[-1][1]["response"]["status"] == "failed"
    assert events[-1][1]["response"]["error"] == {"code": "server_error",
                                                  "message": "engine died"}
    assert encoder.finish() == b""


def test_stream_with_no_chunks_still_opens_and_completes():
    encoder = responses.stream_encoder(request([user("hi")]))
    names = [n for n, _ in events_of(encoder.finish())]
    assert names == ["response.created", "response.in_progress", "response.completed"]
