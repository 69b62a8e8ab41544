"""Anthropic Messages reply pieces shared by the non-streaming reply and the stream."""

from __future__ import annotations

import base64
import hashlib
import time
from typing import Any

__all__ = ["ERROR_TYPES", "message_id", "signature", "stop_fields"]

# HTTP status -> Anthropic error type (docs.anthropic.com "Errors").
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}


def message_id(chat_id: Any) -> str:
    """`msg_` + the engine completion id, so a reply can be found in the engine's log."""
    text = chat_id if isinstance(chat_id, str) and chat_id else f"{time.time_ns():x}"
    return "msg_" + text.removeprefix("chatcmpl-")


def signature(thinking: str) -> str:
    """An opaque signature for a thinking block.

    Claude Code stores it and sends it back with the block; nothing verifies it here. A digest
    of the text keeps it deterministic (same thinking, same signature).
    """
    digest = hashlib.sha256(thinking.encode("utf-8", "surrogatepass")).digest()
    return base64.b64encode(digest).decode()


def stop_fields(finish_reason: Any, matched: Any, request: dict, completion_tokens: int,
                has_tool_use: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for an engine finish reason.

    vLLM reports the stop string that ended generation in `choices[0].stop_reason`; when it is
    one of the agent's `stop_sequences`, Anthropic calls that `stop_sequence`.

    A stop at a token limit is `max_tokens` only when the agent's own `max_tokens` was
    reached. Below it, the limit was the capture session's cap, which Claude Code never asked
    for: Claude Code 2.1 answers `max_tokens` by retrying with a larger limit and then ending
    its run ("response exceeded the 128000 output token maximum", measured), so such a stop is
    reported as the end of the turn (`tool_use` when a tool call was under way). The trace
    keeps the engine's real finish_reason.
    """
    if finish_reason == "length":
        limit = request.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and completion_tokens < limit:
            return ("tool_use" if has_tool_use else "end_turn"), None
    stops = request.get("stop_sequences")
    if (finish_reason == "stop" and isinstance(matched, str) and isinstance(stops, list)
            and matched in stops):
        return "stop_sequence", matched
    if not isinstance(finish_reason, str):
        return "end_turn", None
    return _STOP_REASONS.get(finish_reason, "end_turn"), None
