"""Engine chat chunks -> Responses API SSE events, as they arrive.

Event order, one output item at a time (an item is closed before the next one opens, and
`output_index` counts items in that order):

    response.created, response.in_progress
    reasoning: output_item.added, reasoning_summary_part.added,
               reasoning_summary_text.delta*, reasoning_summary_text.done,
               reasoning_summary_part.done, output_item.done
    message:   output_item.added, content_part.added, output_text.delta*,
               output_text.done, content_part.done, output_item.done
    function:  output_item.added, function_call_arguments.delta*,
               function_call_arguments.done, output_item.done
    custom:    output_item.added, custom_tool_call_input.delta, custom_tool_call_input.done,
               output_item.done            (emitted whole when the call is complete: the engine
                                            streams JSON `{"input": ...}`, the agent wants the
                                            raw string)
    local_shell: output_item.added, output_item.done  (whole, for the same reason)
    response.completed | response.incomplete   (full response with output and usage;
                                                incomplete only at the agent's own limit)
    on failure: error, response.failed

Text and function arguments are passed on the moment the engine sends them. vLLM's hermes
parser streams each tool call as one fragment with `id` + `function.name`, then argument
fragments, calls one after another by `index`.
"""

from __future__ import annotations

import time
from typing import Any

from .base import (
    StreamEncoder,
    StreamTokens,
    as_int,
    reasoning_text,
    sse_event,
)
from .responses_items import (
    ids_from,
    message_item,
    reasoning_item,
    response_object,
    response_usage,
    status_of,
    tool_call_item,
)
from .responses_request import ToolRoute, tool_routes

__all__ = ["ResponsesStreamEncoder"]


class _Call:
    __slots__ = ("call_id", "name", "arguments", "item_id", "output_index", "route", "opened")

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self.name = ""
        self.arguments = ""
        self.item_id = ""
        self.output_index = -1
        self.route: ToolRoute | None = None
        self.opened = False


class ResponsesStreamEncoder(StreamEncoder):
    """State machine of one streamed response (see module docstring)."""

    def __init__(self, request: dict) -> None:
        self._request = request
        self._routes: dict[str, ToolRoute] | None = None  # built at the first tool call
        self._seq = 0
        self._started = False
        self._ended = False
        self._suffix = ""
        self._created = 0
        self._output: list[dict] = []
        self._open: str | None = None  # "reasoning" | "message" | "call"
        self._open_id = ""
        self._text: list[str] = []
        self._calls: dict[int, _Call] = {}
        self._open_call: _Call | None = None
        self._finish: str | None = None
        self._tokens = StreamTokens()

    # --- event helpers ---------------------------------------------------------------------

    def _event(self, kind: str, fields: dict) -> bytes:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(kind, data)

    def _response(self, status: str, output: list[dict], usage: dict | None) -> dict:
        return response_object(self._request, f"resp_{self._suffix}", self._created, status,
                               output, usage, self._finish, echo_large=False)

    def _start(self, chunk: dict) -> bytes:
        self._started = True
        self._suffix = ids_from(chunk.get("id"))
        self._created = as_int(chunk.get("created")) or int(time.time())
        snapshot = self._response("in_progress", [], None)
        return (self._event("response.created", {"response": snapshot})
                + self._event("response.in_progress", {"response": snapshot}))

    # --- items ------------------------------------------------------------------------------

    def _open_item(self, kind: str, item: dict | None) -> bytes:
        out = self._close_item()
        self._open = kind
        self._open_id = item["id"] if item else ""
        self._text = []
        if item is None:
            return out
        index = len(self._output)
        out += self._event("response.output_item.added", {"output_index": index, "item": item})
        if kind == "reasoning":
            out += self._event("response.reasoning_summary_part.added", {
                "item_id": item["id"], "output_index": index, "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}})
        elif kind == "message":
            out += self._event("response.content_part.added", {
                "item_id": item["id"], "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})
        return out

    def _close_item(self) -> bytes:
        kind, self._open = self._open, None
        index = len(self._output)
        if kind == "reasoning":
            text = "".join(self._text)
            item = reasoning_item(self._open_id, text)
            ref = {"item_id": self._open_id, "output_index": index, "summary_index": 0}
            out = (self._event("response.reasoning_summary_text.done", {**ref, "text": text})
                   + self._event("response.reasoning_summary_part.done", {
                       **ref, "part": {"type": "summary_text", "text": text}}))
        elif kind == "message":
            text = "".join(self._text)
            item = message_item(self._open_id, text)
            ref = {"item_id": self._open_id, "output_index": index, "content_index": 0}
            out = (self._event("response.output_text.done", {**ref, "text": text, "logprobs": []})
                   + self._event("response.content_part.done", {
                       **ref, "part": item["content"][0]}))
        elif kind == "call" and self._open_call is not None:
            return self._close_call(self._open_call, index)
        else:
            return b""
        self._output.append(item)
        return out + self._event("response.output_item.done", {"output_index": index,
                                                                "item": item})

    def _close_call(self, call: _Call, index: int) -> bytes:
        self._open_call = None
        item = tool_call_item(call.route, call.item_id, call.call_id, call.name, call.arguments)
        self._output.append(item)
        out = b""
        if item["type"] == "function_call":
            if not call.opened:
                out += self._added_call(item, index)
            out += self._event("response.function_call_arguments.done", {
                "item_id": call.item_id, "output_index": index, "arguments": call.arguments})
        else:
            out += self._added_call(item, index)
            if item["type"] == "custom_tool_call":
                ref = {"item_id": call.item_id, "output_index": index}
                out += (self._event("response.custom_tool_call_input.delta",
                                    {**ref, "delta": item["input"]})
                        + self._event("response.custom_tool_call_input.done",
                                      {**ref, "input": item["input"]}))
        return out + self._event("response.output_item.done", {"output_index": index,
                                                                "item": item})

    def _added_call(self, item: dict, index: int) -> bytes:
        added = dict(item, status="in_progress")
        if item["type"] == "function_call":
            added["arguments"] = ""
        elif item["type"] == "custom_tool_call":
            added["input"] = ""
        return self._event("response.output_item.added", {"output_index": index, "item": added})

    def _tool_fragment(self, fragment: dict) -> bytes:
        index = fragment.get("index", 0)
        index = index if isinstance(index, int) else 0
        function = fragment.get("function") if isinstance(fragment.get("function"), dict) else {}
        call = self._calls.get(index)
        out = b""
        if call is None:
            call = _Call(str(fragment.get("id") or f"call_{self._suffix}_{index}"))
            call.item_id = f"fc_{self._suffix}_{index}"
            self._calls[index] = call
            out += self._open_item("call", None)
            self._open_call = call
        name = function.get("name")
        if isinstance(name, str) and name and not call.opened:
            call.name += name
        arguments = function.get("arguments")
        piece = arguments if isinstance(arguments, str) else ""
        call.arguments += piece
        if call is not self._open_call:
            # A late fragment for a call already closed: its item is final; keep the text only.
            return out
        if self._routes is None:
            self._routes = tool_routes(self._request)
        call.route = self._routes.get(call.name)
        streams = call.route is None or call.route.kind == "function"
        if streams and call.name and not call.opened:
            call.opened = True
            item = tool_call_item(call.route, call.item_id, call.call_id, call.name, "")
            out += self._added_call(item, len(self._output))
            piece = call.arguments  # anything that arrived before the name
        if streams and call.opened and piece:
            out += self._event("response.function_call_arguments.delta", {
                "item_id": call.item_id, "output_index": len(self._output), "delta": piece})
        return out

    # --- StreamEncoder ----------------------------------------------------------------------

    def on_chunk(self, chunk: dict) -> bytes:
        if self._ended:
            return b""
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            return self.fail(str(error.get("message") or chunk["error"]))
        out = b"" if self._started else self._start(chunk)
        prompt_ids = chunk.get("prompt_token_ids")
        if isinstance(prompt_ids, list) and not self._tokens.usage_seen:
            self._tokens.prompt = len(prompt_ids)
        picked = self._tokens.take(chunk)
        if picked is None:
            return out
        choice, delta = picked
        reasoning = reasoning_text(delta)
        if reasoning:
            if self._open != "reasoning":
                out += self._close_item()  # first, so the new item's index is final
                out += self._open_item("reasoning", {
                    "type": "reasoning", "id": f"rs_{self._suffix}_{len(self._output)}",
                    "summary": [], "status": "in_progress"})
            self._text.append(reasoning)
            out += self._event("response.reasoning_summary_text.delta", {
                "item_id": self._open_id, "output_index": len(self._output),
                "summary_index": 0, "delta": reasoning})
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self._open != "message":
                out += self._close_item()
                item = message_item(f"msg_{self._suffix}_{len(self._output)}", "", "in_progress")
                item["content"] = []
                out += self._open_item("message", item)
            self._text.append(content)
            out += self._event("response.output_text.delta", {
                "item_id": self._open_id, "output_index": len(self._output),
                "content_index": 0, "delta": content, "logprobs": []})
        fragments = delta.get("tool_calls")
        if isinstance(fragments, list):
            for fragment in fragments:
                if isinstance(fragment, dict):
                    out += self._tool_fragment(fragment)
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
        return out

    def finish(self) -> bytes:
        if self._ended:
            return b""
        out = b"" if self._started else self._start({})
        out += self._close_item()
        self._ended = True
        status = status_of(self._finish, self._request, self._tokens.completion)
        usage = response_usage(self._tokens.prompt, self._tokens.completion, self._tokens.cached)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, {"response": self._response(status, self._output, usage)})

    def fail(self, message: str) -> bytes:
        if self._ended:
            return b""
        out = b"" if self._started else self._start({})
        self._ended = True
        error: dict[str, Any] = {"code": "server_error", "message": message}
        failed = self._response("failed", self._output, None)
        failed["error"] = error
        return (out + self._event("error", {**error, "param": None})
                + self._event("response.failed", {"response": failed}))
