"""Anthropic Messages API: what Claude Code speaks, translated to and from the engine's chat API.

Wire facts
- Routes: `POST {base}/v1/messages` (Claude Code 2.1 adds `?beta=true`) and
  `POST {base}/v1/messages/count_tokens`; base = `.../s/{session}` (the agent appends `/v1`).
  Claude Code probes `HEAD {base}/` (and `/api/hello`) before its first call.
- Speaker: Claude Code 2.1, always streaming, `x-api-key` auth, `anthropic-version: 2023-06-01`,
  `anthropic-beta` flags. Measured request: `system` as text blocks (first one the
  `x-anthropic-billing-header` line), `role: "system"` messages inside `messages`, 12 tools
  with `input_schema` (one with `defer_loading: true`), `max_tokens: 32000`,
  `thinking: {"type": "adaptive"}`, `context_management`, `output_config`, `metadata`.
  Its aux calls (title/summary/compaction prompts, or no tools) are tagged by the core.
- Reply: a `message` with content blocks in order thinking?, text?, tool_use*; `stop_reason`
  end_turn | max_tokens | tool_use | stop_sequence | refusal; usage input/output tokens.
  `max_tokens` only when the agent's own max_tokens was reached: a stop at the proxy's lower
  cap ends the turn, because Claude Code retries and then aborts on max_tokens (measured; see
  `messages_items.stop_fields`).
- SSE: message_start, ping, content_block_start/delta/stop per block, message_delta,
  message_stop; `error` events on failure (see `messages_stream`).
- Errors: `{"type": "error", "error": {"type": ..., "message": ...}}`.

IDs: `msg_` + engine completion id; a tool_use `id` is the engine's tool call id unchanged, and
Claude Code's `tool_result.tool_use_id` comes back as the chat `tool_call_id`, so the pair holds.
count_tokens is answered here (an approximation: UTF-8 bytes / 4 of the rendered request),
never reaches the engine and is never recorded.
"""

from __future__ import annotations

from typing import Any

from .base import (
    Dialect,
    as_dict,
    dumps,
    first_choice,
    parse_arguments,
    reasoning_text,
    tool_calls_of,
    usage_counts,
)
from .memo import TranslationMemo
from .messages_items import ERROR_TYPES, message_id, signature, stop_fields
from .messages_request import messages_to_chat
from .messages_stream import MessagesStreamEncoder

__all__ = ["MessagesDialect"]


class MessagesDialect(Dialect):
    """Anthropic Messages in, chat to the engine, Messages out."""

    name = "messages"

    def to_chat(self, body: dict, memo: TranslationMemo | None = None) -> dict:
        return messages_to_chat(body, memo=memo)

    def from_chat(self, chat: dict, request: dict) -> dict:
        choice = first_choice(chat)
        message = as_dict(choice.get("message"))
        content: list[dict[str, Any]] = []
        thinking = reasoning_text(message)
        if thinking:
            content.append({"type": "thinking", "thinking": thinking,
                            "signature": signature(thinking)})
        text = message.get("content")
        if isinstance(text, str) and text:
            content.append({"type": "text", "text": text})
        for i, call in enumerate(tool_calls_of(message)):
            function = as_dict(call.get("function"))
            arguments = parse_arguments(function.get("arguments"))
            # Anthropic's `input` is always an object; a call whose arguments are not a JSON
            # object (a truncated or malformed generation) reaches the agent as an empty input,
            # so its tool answers with a validation error the model can learn from.
            content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{i}"),
                            "name": str(function.get("name") or ""),
                            "input": arguments if isinstance(arguments, dict) else {}})
        prompt, completion, cached = usage_counts(chat.get("usage"))
        stop_reason, stop_sequence = stop_fields(
            choice.get("finish_reason"), choice.get("stop_reason"), request, completion,
            any(block["type"] == "tool_use" for block in content))
        return {
            "id": message_id(chat.get("id")),
            "type": "message",
            "role": "assistant",
            "model": request.get("model"),
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": {
                "input_tokens": prompt,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": cached,
                "output_tokens": completion,
            },
        }

    def stream_encoder(self, request: dict) -> MessagesStreamEncoder:
        return MessagesStreamEncoder(request)

    def error_body(self, status: int, message: str) -> dict:
        kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def count_tokens(self, body: dict) -> dict:
        chat = messages_to_chat(body, need_max_tokens=False)
        size = len(dumps([chat["messages"], chat.get("tools", [])]).encode("utf-8", "replace"))
        return {"input_tokens": max(1, size // 4)}
