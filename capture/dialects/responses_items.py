"""Responses output items and the `response` object, shared by replies and streams.

One place builds each item shape, so a non-streaming reply and the final `response.completed`
event of a stream describe the same turn with the same fields.
"""

from __future__ import annotations

import time
from typing import Any

from .base import parse_arguments
from .responses_request import ToolRoute, encode_reasoning

__all__ = [
    "ids_from",
    "message_item",
    "reasoning_item",
    "response_object",
    "response_usage",
    "status_of",
    "tool_call_item",
]


def response_usage(prompt: int, completion: int, cached: int = 0) -> dict:
    """Responses usage object."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def response_object(request: dict, response_id: str, created: int, status: str,
                    output: list[dict], usage: dict | None, finish_reason: str | None,
                    *, echo_large: bool = True) -> dict:
    """The `response` object, echoing the request's settings as the real API does.

    `echo_large=False` leaves out the echo of `instructions` and `tools` (None and []): streams
    send the response object three times, and Codex's tools alone are ~30 KB of JSON that no
    agent reads back, so a stream would pay for serialising them on every call.
    """
    incomplete = None
    if status == "incomplete":
        reason = "content_filter" if finish_reason == "content_filter" else "max_output_tokens"
        incomplete = {"reason": reason}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions") if echo_large else None,
        "max_output_tokens": request.get("max_output_tokens"),
        "model": request.get("model"),
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": request.get("reasoning") or {"effort": None, "summary": None},
        "store": request.get("store", False),
        "temperature": request.get("temperature"),
        "text": request.get("text") or {"format": {"type": "text"}},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": (request.get("tools") or []) if echo_large else [],
        "top_p": request.get("top_p"),
        "truncation": request.get("truncation", "disabled"),
        "usage": usage,
        "user": None,
        "metadata": request.get("metadata") or {},
    }


def status_of(finish_reason: Any, request: dict, completion_tokens: int) -> str:
    """Response status for an engine finish reason.

    A stop at a token limit is `incomplete` only when it is the agent's own
    `max_output_tokens`. The capture proxy caps every call with the session's `max_tokens`,
    a limit Codex never asked for, and Codex 0.171 ends its whole run on `response.incomplete`
    ("Incomplete response returned, reason: max_output_tokens", measured). Reporting that stop
    as `completed` lets the rollout go on; the trace keeps the engine's real finish_reason.
    """
    if finish_reason == "content_filter":
        return "incomplete"
    if finish_reason != "length":
        return "completed"
    limit = request.get("max_output_tokens")
    own_limit = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    return "incomplete" if own_limit and completion_tokens >= limit else "completed"


def reasoning_item(item_id: str, text: str) -> dict:
    return {
        "type": "reasoning",
        "id": item_id,
        "summary": [{"type": "summary_text", "text": text}],
        "content": [{"type": "reasoning_text", "text": text}],
        "encrypted_content": encode_reasoning(text),
        "status": "completed",
    }


def message_item(item_id: str, text: str, status: str = "completed") -> dict:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _local_shell_action(arguments: str) -> dict | None:
    args = parse_arguments(arguments)
    if not isinstance(args, dict):
        return None
    command = args.get("command")
    if isinstance(command, str):
        command = ["bash", "-lc", command]
    if not (isinstance(command, list) and all(isinstance(c, str) for c in command)):
        return None
    action: dict[str, Any] = {"type": "exec", "command": command, "env": {}}
    if isinstance(args.get("workdir"), str):
        action["working_directory"] = args["workdir"]
    if isinstance(args.get("timeout_ms"), int):
        action["timeout_ms"] = args["timeout_ms"]
    return action


def tool_call_item(route: ToolRoute | None, item_id: str, call_id: str, chat_name: str,
                   arguments: str, status: str = "completed") -> dict:
    """The output item for one engine tool call, shaped by the tool's declared kind.

    A call the model made to a tool that was not declared, or whose arguments do not fit a
    custom/local_shell tool, stays a plain `function_call`: Codex answers it with an error
    output, which is the signal the model should learn from.
    """
    if route is not None and route.kind == "custom":
        args = parse_arguments(arguments)
        if isinstance(args, dict) and isinstance(args.get("input"), str):
            return {"type": "custom_tool_call", "id": item_id, "call_id": call_id,
                    "name": route.name, "input": args["input"], "status": status}
    if route is not None and route.kind == "local_shell":
        action = _local_shell_action(arguments)
        if action is not None:
            return {"type": "local_shell_call", "id": item_id, "call_id": call_id,
                    "status": status, "action": action}
    item = {"type": "function_call", "id": item_id, "call_id": call_id,
            "name": route.name if route is not None and route.kind == "function" else chat_name,
            "arguments": arguments, "status": status}
    if route is not None and route.namespace is not None:
        item["namespace"] = route.namespace
    return item


def ids_from(chat_id: Any) -> str:
    """A stable suffix for response and item ids, taken from the engine completion id."""
    text = chat_id if isinstance(chat_id, str) and chat_id else f"{time.time_ns():x}"
    return text.removeprefix("chatcmpl-")
