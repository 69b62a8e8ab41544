"""Anthropic Messages dialect (Claude Code): blocks <-> chat messages, reply shape, SSE order.

    .venv/bin/python -m pytest tests/test_dialects_messages.py -q
"""

from __future__ import annotations

import json

import pytest

from capture.dialects import DIALECTS, DialectError
from tests.fixtures.dialects.fake_engine import engine_chunks, engine_reply

messages = DIALECTS["messages"]

BASH = {"name": "Bash", "description": "run a command",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}


def request(msgs, **extra) -> dict:
    return {"model": "claude-test", "max_tokens": 1024, "system": "You are Claude.",
            "messages": msgs, "tools": [BASH], "stream": True, **extra}


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
    return out


def stream(reply: dict, req: dict) -> list[tuple[str, dict]]:
    encoder = messages.stream_encoder(req)
    data = b"".join(encoder.on_chunk(c) for c in engine_chunks(reply)) + encoder.finish()
    return events_of(data)


# --- request ---------------------------------------------------------------------------------


def test_system_blocks_join_into_the_first_system_message():
    out = messages.to_chat(request([{"role": "user", "content": "hi"}], system=[
        {"type": "text", "text": "one"}, {"type": "text", "text": "two",
                                          "cache_control": {"type": "ephemeral"}}]))
    assert out["messages"][0] == {"role": "system", "content": "one\ntwo"}


def test_billing_line_keeps_its_text_but_loses_the_per_request_hash():
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=ab12;"},
              {"type": "text", "text": "You are Claude."}]
    out = messages.to_chat(request([{"role": "user", "content": "hi"}], system=system))
    assert out["messages"][0]["content"] == (
        "x-anthropic-billing-header: cc_version=2.1;\nYou are Claude.")


def test_system_messages_inside_messages_stay_in_place():
    out = messages.to_chat(request([
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "system", "content": [{"type": "text", "text": "env"}]}]))
    assert out["messages"][1:] == [{"role": "user", "content": "hi"},
                                   {"role": "system", "content": "env"}]


def test_tool_use_and_results_round_trip_with_their_ids():
    out = messages.to_chat(request([
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "use ls", "signature": "sig"},
            {"type": "text", "text": "Listing."},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pwd"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "/w"},
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "ls: denied"}]},
            {"type": "text", "text": "go on"}]}]))
    assert out["messages"][2:] == [
        {"role": "assistant", "content": "Listing.", "reasoning": "use ls",
         "tool_calls": [
             {"id": "toolu_1", "type": "function",
              "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
             {"id": "toolu_2", "type": "function",
              "function": {"name": "Bash", "arguments": '{"command": "pwd"}'}}]},
        # results follow the call order (the template shows no ids); the error is marked
        {"role": "tool", "tool_call_id": "toolu_1", "content": "[tool error] ls: denied"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "/w"},
        {"role": "user", "content": "go on"},
    ]


def test_redacted_thinking_is_dropped_and_images_become_image_parts():
    out = messages.to_chat(request([
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xx"},
                                          {"type": "text", "text": "ok"}]}]))
    assert out["messages"][1]["content"] == [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    assert out["messages"][2] == {"role": "assistant", "content": "ok"}


def test_tools_choice_and_limits_translate():
    out = messages.to_chat(request(
        [{"role": "user", "content": "hi"}], max_tokens=77, stop_sequences=["END"],
        temperature=0.2, top_k=5,
        tool_choice={"type": "tool", "name": "Bash", "disable_parallel_tool_use": True},
        tools=[BASH, {**BASH, "name": "Later", "defer_loading": True},
               {"type": "web_search_20250305", "name": "web_search"}]))
    assert out["tools"] == [
        {"type": "function", "function": {"name": "Bash", "description": "run a command",
                                          "parameters": BASH["input_schema"]}},
        {"type": "function", "function": {"name": "Later", "description": "run a command",
                                          "parameters": BASH["input_schema"]},
         "defer_loading": True}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "Bash"}}
    assert out["parallel_tool_calls"] is False
    assert out["max_tokens"] == 77 and out["stop"] == ["END"]
    assert out["temperature"] == 0.2 and out["top_k"] == 5
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("choice, expected", [({"type": "auto"}, "auto"),
                                              ({"type": "any"}, "required"),
                                              ({"type": "none"}, "none")])
def test_tool_choice_kinds(choice, expected):
    out = messages.to_chat(request([{"role": "user", "content": "hi"}], tool_choice=choice))
    assert out["tool_choice"] == expected


@pytest.mark.parametrize("change, where", [
    ({"messages": {}}, "messages must be an array"),
    ({"messages": []}, "messages must not be empty"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content must be"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "Bash", "input": "ls"}]}]},
     "messages[0].content[0].input must be an object"),
    ({"messages": [{"role": "user", "content": [{"type": "document"}]}]}, "document"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "file"}}]}]}, "source.type 'file'"),
    ({"max_tokens": None}, "max_tokens must be an integer"),
    ({"max_tokens": 0}, "max_tokens must be >= 1"),
    ({"system": 5}, "system must be an array"),
    ({"system": [{"type": "image"}]}, "system[0].type must be 'text'"),
    ({"tools": [{"name": "x"}]}, "tools[0].input_schema must be an object"),
    ({"tools": [{"type": "mystery_tool", "name": "x"}]}, "tools[0].type 'mystery_tool'"),
    ({"tool_choice": {"type": "some"}}, "tool_choice.type"),
    ({"stop_sequences": "END"}, "stop_sequences must be an array"),
])
def test_malformed_requests_raise_dialect_error_naming_the_field(change, where):
    with pytest.raises(DialectError) as info:
        messages.to_chat({**request([{"role": "user", "content": "hi"}]), **change})
    assert where in info.value.message


# --- non-streaming reply ---------------------------------------------------------------------


def test_reply_has_thinking_text_and_tool_uses_in_order():
    reply = engine_reply(reasoning="plan", content="Listing.", chat_id="chatcmpl-abc",
                         tool_calls=[("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})])
    out = messages.from_chat(reply, request([{"role": "user", "content": "hi"}]))
    calls = reply["choices"][0]["message"]["tool_calls"]
    assert out["id"] == "msg_abc" and out["type"] == "message" and out["role"] == "assistant"
    assert out["model"] == "claude-test"
    thinking, text, use1, use2 = out["content"]
    assert thinking["type"] == "thinking" and thinking["thinking"] == "plan"
    assert isinstance(thinking["signature"], str) and thinking["signature"]
    assert text == {"type": "text", "text": "Listing."}
    assert use1 == {"type": "tool_use", "id": calls[0]["id"], "name": "Bash",
                    "input": {"command": "ls"}}
    assert use2["id"] == calls[1]["id"] and use2["input"] == {"command": "pwd"}
    assert out["stop_reason"] == "tool_use" and out["stop_sequence"] is None
    assert out["usage"] == {"input_tokens": reply["usage"]["prompt_tokens"],
                            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                            "output_tokens": reply["usage"]["completion_tokens"]}


@pytest.mark.parametrize("finish, stop", [("stop", "end_turn"), ("tool_calls", "tool_use")])
def test_stop_reasons(finish, stop):
    out = messages.from_chat(engine_reply(content="x", finish_reason=finish),
                             request([{"role": "user", "content": "hi"}]))
    assert out["stop_reason"] == stop


def test_reaching_the_agents_own_max_tokens_is_max_tokens():
    reply = engine_reply(content="x" * 30, finish_reason="length")
    limit = reply["usage"]["completion_tokens"]  # the engine stopped exactly at the agent's limit
    out = messages.from_chat(reply, request([{"role": "user", "content": "hi"}],
                                            max_tokens=limit))
    assert out["stop_reason"] == "max_tokens"


def test_a_stop_at_the_proxy_cap_below_the_agents_limit_ends_the_turn():
    # Claude Code asked for 1024 tokens; the session cap stopped the engine after ~11.
    reply = engine_reply(content="x" * 30, finish_reason="length")
    out = messages.from_chat(reply, request([{"role": "user", "content": "hi"}]))
    assert out["stop_reason"] == "end_turn"
    capped_call = engine_reply(tool_calls=[("Bash", '{"command": "l')], finish_reason="length")
    out = messages.from_chat(capped_call, request([{"role": "user", "content": "hi"}]))
    assert out["stop_reason"] == "tool_use"


def test_a_matched_stop_sequence_is_reported():
    req = request([{"role": "user", "content": "hi"}], stop_sequences=["END"])
    out = messages.from_chat(engine_reply(content="x", stop_reason="END"), req)
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "END")


def test_tool_arguments_that_are_not_an_object_become_empty_input():
    out = messages.from_chat(engine_reply(tool_calls=[("Bash", '{"command": "l')]),
                             request([{"role": "user", "content": "hi"}]))
    assert out["content"][0]["input"] == {}


def test_thinking_signature_round_trips_to_the_same_reasoning():
    req = request([{"role": "user", "content": "hi"}])
    reply = messages.from_chat(engine_reply(reasoning="plan", content="ok"), req)
    out = messages.to_chat(request([{"role": "user", "content": "hi"},
                                    {"role": "assistant", "content": reply["content"]}]))
    assert out["messages"][-1] == {"role": "assistant", "content": "ok",
                                   "reasoning": "plan"}


@pytest.mark.parametrize("status, kind", [(400, "invalid_request_error"),
                                          (401, "authentication_error"),
                                          (413, "request_too_large"),
                                          (429, "rate_limit_error"), (500, "api_error"),
                                          (529, "overloaded_error")])
def test_error_body_is_anthropic_shaped(status, kind):
    assert messages.error_body(status, "why") == {
        "type": "error", "error": {"type": kind, "message": "why"}}


def test_count_tokens_answers_without_max_tokens():
    answer = messages.count_tokens({"model": "m", "messages": [{"role": "user",
                                                                "content": "hello " * 100}]})
    assert set(answer) == {"input_tokens"} and 100 < answer["input_tokens"] < 400


def test_count_tokens_rejects_malformed_bodies():
    with pytest.raises(DialectError, match="messages must be an array"):
        messages.count_tokens({"model": "m"})


# --- streaming -------------------------------------------------------------------------------


def test_stream_event_order_for_thinking_text_and_two_tool_uses():
    reply = engine_reply(reasoning="plan", content="Listing.",
                         tool_calls=[("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})])
    events = stream(reply, request([{"role": "user", "content": "hi"}]))
    shape = [(n, p.get("index"), (p.get("delta") or p.get("content_block") or {}).get("type"))
             for n, p in events]
    tool = [("content_block_start", None, "tool_use"),
            ("content_block_delta", None, "input_json_delta"),
            ("content_block_delta", None, "input_json_delta"),
            ("content_block_stop", None, None)]
    expected = [("message_start", None, None), ("ping", None, None),
                ("content_block_start", 0, "thinking"),
                ("content_block_delta", 0, "thinking_delta"),
                ("content_block_delta", 0, "thinking_delta"),
                ("content_block_delta", 0, "signature_delta"),
                ("content_block_stop", 0, None),
                ("content_block_start", 1, "text"),
                ("content_block_delta", 1, "text_delta"),
                ("content_block_delta", 1, "text_delta"),
                ("content_block_stop", 1, None),
                *[(n, 2, t) for n, _, t in tool], *[(n, 3, t) for n, _, t in tool],
                ("message_delta", None, None), ("message_stop", None, None)]
    assert shape == expected


def test_stream_blocks_add_up_to_the_non_streaming_reply():
    req = request([{"role": "user", "content": "hi"}])
    reply = engine_reply(reasoning="plan", content="Listing.", chat_id="chatcmpl-abc",
                         tool_calls=[("Bash", {"command": "ls"}), ("Bash", {"command": "pwd"})])
    blocks: list[dict] = []
    for name, p in stream(reply, req):
        if name == "content_block_start":
            blocks.append(dict(p["content_block"]))
        elif name == "content_block_delta":
            block, delta = blocks[p["index"]], p["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                block["partial"] = block.get("partial", "") + delta["partial_json"]
    for block in blocks:
        if "partial" in block:
            block["input"] = json.loads(block.pop("partial"))
    assert blocks == messages.from_chat(reply, req)["content"]


def test_stream_message_start_and_delta_carry_ids_and_usage():
    reply = engine_reply(content="hi", chat_id="chatcmpl-abc", prompt_tokens=12)
    events = stream(reply, request([{"role": "user", "content": "hi"}]))
    start = events[0][1]["message"]
    assert start["id"] == "msg_abc" and start["model"] == "claude-test"
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 12  # from the first chunk's prompt_token_ids
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == reply["usage"]["completion_tokens"]


def test_stream_failure_is_an_error_event_and_nothing_after_it():
    encoder = messages.stream_encoder(request([{"role": "user", "content": "hi"}]))
    chunks = engine_chunks(engine_reply(content="hi"))
    encoder.on_chunk(chunks[0])
    assert events_of(encoder.fail("engine died")) == [
        ("error", {"type": "error", "error": {"type": "api_error", "message": "engine died"}})]
    assert encoder.on_chunk(chunks[1]) == b"" and encoder.finish() == b""


def test_stream_with_no_chunks_still_sends_a_whole_message():
    encoder = messages.stream_encoder(request([{"role": "user", "content": "hi"}]))
    names = [n for n, _ in events_of(encoder.finish())]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]
