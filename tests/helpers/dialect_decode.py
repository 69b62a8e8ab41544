"""What an agent would read back from a dialect's reply: reasoning, text and tool calls.

Decodes each wire form the way its client does (a whole reply, or the SSE stream assembled from
its deltas, never from the final summary event alone), so a test can compare the round trip
engine reply -> dialect -> agent with what the engine said. Written from the public wire
formats (OpenAI chat completions and Responses, Anthropic Messages), not from capture's code.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Said", "decode_reply", "decode_stream"]

# (reasoning, text, [(tool name, arguments as a dict), ...])
Said = tuple[str, str, list[tuple[str, dict]]]


def _events(data: bytes) -> list[tuple[str | None, Any]]:
    """SSE blocks -> (event name or None, parsed data); `[DONE]` is kept as the string."""
    assert data.endswith(b"\n\n"), "an SSE stream ends with a blank line"
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        name, payload = None, []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                payload.append(line[5:].strip())
        text = "\n".join(payload)
        out.append((name, text if text == "[DONE]" else json.loads(text)))
    return out


def decode_reply(dialect: str, reply: dict) -> Said:
    """A whole (non-streamed) reply of `dialect` ("chat", "messages", "responses")."""
    reasoning, text, calls = "", "", []
    if dialect == "chat":
        message = reply["choices"][0]["message"]
        reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
        text = message.get("content") or ""
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                 for c in message.get("tool_calls") or []]
    elif dialect == "messages":
        for block in reply["content"]:
            if block["type"] == "thinking":
                reasoning += block["thinking"]
            elif block["type"] == "text":
                text += block["text"]
            elif block["type"] == "tool_use":
                calls.append((block["name"], block["input"]))
    elif dialect == "responses":
        for item in reply["output"]:
            if item["type"] == "reasoning":
                reasoning += "".join(part["text"] for part in item.get("summary") or [])
            elif item["type"] == "message":
                text += "".join(part["text"] for part in item["content"]
                                if part["type"] == "output_text")
            elif item["type"] == "function_call":
                calls.append((item["name"], json.loads(item["arguments"])))
    else:
        raise ValueError(f"unknown dialect {dialect!r}")
    return reasoning, text, calls


def decode_stream(dialect: str, data: bytes) -> Said:
    """A streamed reply of `dialect`, assembled from its deltas as a client would."""
    events = _events(data)
    reasoning, text = "", ""
    calls: dict[int, list[str]] = {}  # index -> [name, arguments so far]
    if dialect == "chat":
        assert events[-1] == (None, "[DONE]"), "a chat stream ends with data: [DONE]"
        for _, chunk in events[:-1]:
            for choice in chunk["choices"]:
                delta = choice["delta"]
                reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
                text += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    slot = calls.setdefault(call["index"], ["", ""])
                    slot[0] += call.get("function", {}).get("name") or ""
                    slot[1] += call.get("function", {}).get("arguments") or ""
    elif dialect == "messages":
        assert events[-1][0] == "message_stop", "a messages stream ends with message_stop"
        for name, event in events:
            if name == "content_block_start" and event["content_block"]["type"] == "tool_use":
                calls[event["index"]] = [event["content_block"]["name"], ""]
            elif name == "content_block_delta":
                delta = event["delta"]
                if delta["type"] == "thinking_delta":
                    reasoning += delta["thinking"]
                elif delta["type"] == "text_delta":
                    text += delta["text"]
                elif delta["type"] == "input_json_delta":
                    calls[event["index"]][1] += delta["partial_json"]
    elif dialect == "responses":
        assert events[-1][0] == "response.completed", "a responses stream ends completed"
        for name, event in events:
            if name == "response.reasoning_summary_text.delta":
                reasoning += event["delta"]
            elif name == "response.output_text.delta":
                text += event["delta"]
            elif name == "response.output_item.added" and event["item"]["type"] == "function_call":
                calls[event["output_index"]] = [event["item"]["name"], ""]
            elif name == "response.function_call_arguments.delta":
                calls[event["output_index"]][1] += event["delta"]
    else:
        raise ValueError(f"unknown dialect {dialect!r}")
    return reasoning, text, [(n, json.loads(a or "{}")) for n, a in
                             (calls[i] for i in sorted(calls))]
