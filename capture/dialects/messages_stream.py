"""Engine chat chunks -> Anthropic Messages SSE events, as they arrive.

Event order (what the real API sends and Claude Code 2.1 parses):

    message_start {message: id, model, empty content, usage.input_tokens}
    ping
    per content block, in order (index counts blocks):
      content_block_start {index, content_block: thinking | text | tool_use(input {})}
      content_block_delta {index, delta: thinking_delta | text_delta | input_json_delta}*
      (thinking only) content_block_delta {delta: signature_delta}
      content_block_stop {index}
    message_delta {delta: {stop_reason, stop_sequence}, usage: {output_tokens, ...}}
    message_stop
    on failure: error {error: {type: api_error, message}} and the stream ends.

A block is closed before the next one opens. Text and tool-input JSON are passed on the moment
the engine sends them; tool input arrives as the raw JSON fragments vLLM's hermes parser cuts
from the model output, which Claude Code concatenates and parses at content_block_stop.
`message_start` is sent with the first engine chunk, which carries `prompt_token_ids` (or the core
cut them out of it first and told their count: `set_prompt_tokens`), so `input_tokens` is the
engine's real prompt length.
"""

from __future__ import annotations

from .base import StreamEncoder, StreamTokens, reasoning_text, sse_event
from .messages_items import message_id, signature, stop_fields

__all__ = ["MessagesStreamEncoder"]


class MessagesStreamEncoder(StreamEncoder):
    """State machine of one streamed message (see module docstring)."""

    def __init__(self, request: dict) -> None:
        self._request = request
        self._model = request.get("model")
        self._started = False
        self._ended = False
        self._block = -1  # index of the open block, -1 when none is open
        self._kind: str | None = None  # "thinking" | "text" | "tool_use"
        self._next = 0
        self._thinking: list[str] = []
        self._calls: dict[int, int] = {}  # engine tool index -> block index
        self._finish: str | None = None
        self._stop_reason_value: object = None
        self._tokens = StreamTokens()

    def set_prompt_tokens(self, n: int) -> None:
        self._tokens.prompt = n

    def _start(self, chunk: dict) -> bytes:
        self._started = True
        prompt_ids = chunk.get("prompt_token_ids")
        if isinstance(prompt_ids, list):
            self._tokens.prompt = len(prompt_ids)
        message = {
            "id": message_id(chunk.get("id")),
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._tokens.prompt, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0, "output_tokens": 1},
        }
        return (sse_event("message_start", {"type": "message_start", "message": message})
                + sse_event("ping", {"type": "ping"}))

    def _open(self, kind: str, block: dict) -> bytes:
        out = self._close()
        self._block, self._kind = self._next, kind
        self._next += 1
        return out + sse_event("content_block_start", {
            "type": "content_block_start", "index": self._block, "content_block": block})

    def _close(self) -> bytes:
        if self._block < 0:
            return b""
        out = b""
        if self._kind == "thinking":
            out += self._delta({"type": "signature_delta",
                                "signature": signature("".join(self._thinking))})
            self._thinking = []
        out += sse_event("content_block_stop", {"type": "content_block_stop",
                                                "index": self._block})
        self._block, self._kind = -1, None
        return out

    def _delta(self, delta: dict) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta",
                                                 "index": self._block, "delta": delta})

    def _tool_fragment(self, fragment: dict) -> bytes:
        index = fragment.get("index", 0)
        index = index if isinstance(index, int) else 0
        function = fragment.get("function") if isinstance(fragment.get("function"), dict) else {}
        out = b""
        if index not in self._calls:
            name = function.get("name")
            call_id = fragment.get("id")
            out += self._open("tool_use", {
                "type": "tool_use",
                "id": call_id if isinstance(call_id, str) and call_id else f"toolu_{index}",
                "name": name if isinstance(name, str) else "",
                "input": {}})
            self._calls[index] = self._block
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments and self._calls[index] == self._block:
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def on_chunk(self, chunk: dict) -> bytes:
        if self._ended:
            return b""
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            return self.fail(str(error.get("message") or chunk["error"]))
        out = b"" if self._started else self._start(chunk)
        picked = self._tokens.take(chunk)
        if picked is None:
            return out
        choice, delta = picked
        reasoning = reasoning_text(delta)
        if reasoning:
            if self._kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "",
                                               "signature": ""})
            self._thinking.append(reasoning)
            out += self._delta({"type": "thinking_delta", "thinking": reasoning})
        content = delta.get("content")
        if isinstance(content, str) and content:
            if self._kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": content})
        fragments = delta.get("tool_calls")
        if isinstance(fragments, list):
            for fragment in fragments:
                if isinstance(fragment, dict):
                    out += self._tool_fragment(fragment)
        if isinstance(choice.get("finish_reason"), str):
            self._finish = choice["finish_reason"]
            self._stop_reason_value = choice.get("stop_reason")
        return out

    def finish(self) -> bytes:
        if self._ended:
            return b""
        out = b"" if self._started else self._start({})
        out += self._close()
        self._ended = True
        stop_reason, stop_sequence = stop_fields(self._finish, self._stop_reason_value,
                                                 self._request, self._tokens.completion,
                                                 bool(self._calls))
        usage = {"input_tokens": self._tokens.prompt, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": self._tokens.cached,
                 "output_tokens": self._tokens.completion}
        return (out + sse_event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage})
                + sse_event("message_stop", {"type": "message_stop"}))

    def fail(self, message: str) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        return sse_event("error", {"type": "error",
                                   "error": {"type": "api_error", "message": message}})
