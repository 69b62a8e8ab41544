"""Per-dialect readers of trace turns, for `harness.shared.outcome`: tool calls, tool results, transcript.

Four shapes, one small class each, all answering the same four questions of a turn:
    calls(response)          -> [(call id, tool name)]        tool calls the model made
    results(request, names)  -> [ToolResult]                   tool results the agent sent back
    transcript(request)      -> chat messages                  what the model saw
    reply(response)          -> chat messages                  what it answered

    Captured   our capture proxy's chat form (any dialect): choices[0].message, new_messages
    Chat       OpenAI chat completions wire shape: choices[0].message
    Responses  OpenAI Responses: input[] / output[] items (function_call, *_call_output, ...)
    Messages   Anthropic Messages: tool_use / tool_result blocks, is_error

A reader never decides what counts as a failure beyond the agent's own record
(`ToolResult.failed`: True / False when the record states an exit status or error flag, None
when it says nothing); the failure words, used only for None, are `harness.shared.outcome`'s rule.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["READERS", "Captured", "ToolResult"]

Message = dict[str, Any]
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")


@dataclass(frozen=True)
class ToolResult:
    """One tool result as the agent recorded it.

    name:    the tool's name (from the call it answers)
    text:    its text
    failed:  the agent's own record: True (non-zero exit, is_error, success false), False (exit
             0, is_error false, success true), None (no record: the text decides)
    call_id: the id of the call it answers (None when the shape carries none)
    """

    name: str
    text: str
    failed: bool | None
    call_id: Any = None

    @property
    def flagged_error(self) -> bool:
        return self.failed is True


def _text_of(content: Any) -> str:
    """Plain text of a content field: a string, a list of text blocks, or anything JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                parts.append(str(block.get("text", block.get("content", ""))))
            else:
                parts.append(str(block))
        return "\n".join(p for p in parts if p)
    if isinstance(content, dict) and "text" in content:
        return str(content["text"])
    return json.dumps(content, sort_keys=True, default=str)


def _record_failed(text: str) -> bool | None:
    """The agent's own exit-code record in a result's text: failed (True), succeeded (False),
    or no record (None).

    mini-swe-agent 2.x writes {"returncode": N, "output": ...} (1.x: <returncode>N</returncode>);
    Codex's JSON tool output carries {"metadata": {"exit_code": N}}. N != 0 is a failure, and
    N == 0 is a success whatever the output says (a grep for "error" that found none).
    """
    match = _RETURNCODE.search(text)
    if match is not None:
        return int(match.group(1)) != 0
    if not text.lstrip().startswith("{"):
        return None
    try:
        parsed = json.loads(text)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    code = parsed.get("returncode", parsed.get("exit_code"))
    if code is None and isinstance(parsed.get("metadata"), dict):
        code = parsed["metadata"].get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code != 0
    return None


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


class _Chat:
    """OpenAI chat completions (opencode, mini-swe-agent): `choices[0].message`."""

    @staticmethod
    def calls(response: dict[str, Any]) -> list[tuple[Any, str]]:
        return _tool_calls(_Chat._message(response))

    @staticmethod
    def results(request: dict[str, Any], names: dict[Any, str]) -> list[ToolResult]:
        messages = request.get("messages") or []
        for m in messages:
            names.update(_tool_calls(m))
        out = []
        for m in messages:
            if m.get("role") != "tool":
                continue
            text = _text_of(m.get("content"))
            call_id = m.get("tool_call_id")
            name = m.get("name") or names.get(call_id) or "unknown"
            # "[tool error]" is how our proxy renders an Anthropic `is_error: true` result.
            failed = True if text.startswith("[tool error]") else _record_failed(text)
            out.append(ToolResult(name, text, failed, call_id))
        return out

    @staticmethod
    def transcript(request: dict[str, Any]) -> list[Message]:
        return [dict(m) for m in request.get("messages") or []]

    @staticmethod
    def reply(response: dict[str, Any]) -> list[Message]:
        message = _Chat._message(response)
        if not message:
            return []
        reply: Message = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            reply["tool_calls"] = message["tool_calls"]
        return [reply]

    @staticmethod
    def _message(response: dict[str, Any]) -> dict[str, Any]:
        choices = response.get("choices") or [{}]
        return choices[0].get("message") or {}


class Captured(_Chat):
    """Our capture proxy's chat form, any dialect: `choices[0].message` (older traces:
    `response.message`), the messages a turn added in `request.new_messages` (older traces:
    `request.messages`), and on a conversation's last turn its whole transcript in
    `request.messages`."""

    @staticmethod
    def calls(response: dict[str, Any]) -> list[tuple[Any, str]]:
        return _tool_calls(Captured._message(response))

    @staticmethod
    def results(request: dict[str, Any], names: dict[Any, str]) -> list[ToolResult]:
        return _Chat.results({"messages": Captured.new_messages(request)}, names)

    @staticmethod
    def reply(response: dict[str, Any]) -> list[Message]:
        message = Captured._message(response)
        return [dict(message)] if message else []

    @staticmethod
    def new_messages(request: dict[str, Any]) -> list[Message]:
        if "new_messages" in request:
            return list(request.get("new_messages") or [])
        return list(request.get("messages") or [])

    @staticmethod
    def _message(response: dict[str, Any]) -> dict[str, Any]:
        message = response.get("message") if "message" in response else _Chat._message(response)
        return message if isinstance(message, dict) else {}


def _tool_calls(message: dict[str, Any]) -> list[tuple[Any, str]]:
    """(id, name) of each tool call in a chat assistant message."""
    return [
        (tc.get("id"), str((tc.get("function") or tc).get("name") or "unknown"))
        for tc in message.get("tool_calls") or []
        if isinstance(tc, dict)
    ]


class _Responses:
    """OpenAI Responses: Codex (function_call, custom_tool_call, local_shell_call items)."""

    _CALLS = ("function_call", "custom_tool_call", "local_shell_call")
    _OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")

    @staticmethod
    def _call_name(item: dict[str, Any]) -> str:
        if item.get("type") == "local_shell_call":
            return "local_shell"
        return str(item.get("name") or "unknown")

    @staticmethod
    def _items(value: Any) -> list[dict[str, Any]]:
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": value}]
        return [item for item in value or [] if isinstance(item, dict)]

    @staticmethod
    def calls(response: dict[str, Any]) -> list[tuple[Any, str]]:
        return [
            (item.get("call_id"), _Responses._call_name(item))
            for item in _Responses._items(response.get("output"))
            if item.get("type") in _Responses._CALLS
        ]

    @staticmethod
    def results(request: dict[str, Any], names: dict[Any, str]) -> list[ToolResult]:
        items = _Responses._items(request.get("input"))
        names.update(
            (item.get("call_id"), _Responses._call_name(item))
            for item in items
            if item.get("type") in _Responses._CALLS
        )
        out = []
        for item in items:
            if item.get("type") not in _Responses._OUTPUTS:
                continue
            output = item.get("output")
            failed: bool | None = None
            if isinstance(output, dict):
                success = output.get("success")
                failed = (not success) if isinstance(success, bool) else None
                output = output.get("content", output)
            text = _text_of(output)
            if failed is None:
                failed = _record_failed(text)
            call_id = item.get("call_id")
            out.append(ToolResult(names.get(call_id, "unknown"), text, failed, call_id))
        return out

    @staticmethod
    def transcript(request: dict[str, Any]) -> list[Message]:
        messages: list[Message] = []
        if request.get("instructions"):
            messages.append({"role": "system", "content": str(request["instructions"])})
        names: dict[Any, str] = {}
        for item in _Responses._items(request.get("input")):
            messages.extend(_Responses._item_to_messages(item, names, messages))
        return messages

    @staticmethod
    def reply(response: dict[str, Any]) -> list[Message]:
        messages: list[Message] = []
        for item in _Responses._items(response.get("output")):
            messages.extend(_Responses._item_to_messages(item, {}, messages))
        return messages

    @staticmethod
    def _item_to_messages(
        item: dict[str, Any], names: dict[Any, str], so_far: list[Message]
    ) -> list[Message]:
        kind = item.get("type", "message")
        if kind == "message":
            return [{"role": item.get("role", "user"), "content": _text_of(item.get("content"))}]
        if kind in _Responses._CALLS:
            name = _Responses._call_name(item)
            names[item.get("call_id")] = name
            arguments = item.get("arguments", item.get("input", item.get("action", {})))
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": name, "arguments": _arguments(arguments)},
            }
            # Consecutive calls belong to one assistant message, as in a chat transcript.
            if so_far and so_far[-1].get("role") == "assistant" and "tool_calls" in so_far[-1]:
                so_far[-1]["tool_calls"].append(call)
                return []
            return [{"role": "assistant", "content": "", "tool_calls": [call]}]
        if kind in _Responses._OUTPUTS:
            output = item.get("output")
            if isinstance(output, dict):
                output = output.get("content", output)
            return [
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "name": names.get(item.get("call_id"), "unknown"),
                    "content": _text_of(output),
                }
            ]
        return []  # reasoning items and the like carry no transcript text


class _Messages:
    """Anthropic Messages: Claude Code (tool_use / tool_result blocks, is_error)."""

    @staticmethod
    def _blocks(content: Any) -> list[dict[str, Any]]:
        if isinstance(content, str):
            return [{"type": "text", "text": content}]
        return [b for b in content or [] if isinstance(b, dict)]

    @staticmethod
    def calls(response: dict[str, Any]) -> list[tuple[Any, str]]:
        return [
            (b.get("id"), str(b.get("name") or "unknown"))
            for b in _Messages._blocks(response.get("content"))
            if b.get("type") == "tool_use"
        ]

    @staticmethod
    def results(request: dict[str, Any], names: dict[Any, str]) -> list[ToolResult]:
        messages = request.get("messages") or []
        names.update(
            (b.get("id"), str(b.get("name") or "unknown"))
            for m in messages
            for b in _Messages._blocks(m.get("content"))
            if b.get("type") == "tool_use"
        )
        return [
            ToolResult(
                names.get(b.get("tool_use_id")) or "unknown",
                _text_of(b.get("content")),
                # is_error is the agent's record when present; absent, the text decides
                b["is_error"] if isinstance(b.get("is_error"), bool) else None,
                b.get("tool_use_id"),
            )
            for m in messages
            for b in _Messages._blocks(m.get("content"))
            if b.get("type") == "tool_result"
        ]

    @staticmethod
    def transcript(request: dict[str, Any]) -> list[Message]:
        messages: list[Message] = []
        system = request.get("system")
        if system:
            messages.append({"role": "system", "content": _text_of(system)})
        names: dict[Any, str] = {}
        for m in request.get("messages") or []:
            messages.extend(_Messages._to_chat(m.get("role", "user"), m.get("content"), names))
        return messages

    @staticmethod
    def reply(response: dict[str, Any]) -> list[Message]:
        if "content" not in response:
            return []
        return _Messages._to_chat("assistant", response.get("content"), {})

    @staticmethod
    def _to_chat(role: str, content: Any, names: dict[Any, str]) -> list[Message]:
        blocks = _Messages._blocks(content)
        text = "\n".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        calls = [
            {
                "id": b.get("id"),
                "type": "function",
                "function": {"name": b.get("name"), "arguments": _arguments(b.get("input", {}))},
            }
            for b in blocks
            if b.get("type") == "tool_use"
        ]
        for call in calls:
            names[call["id"]] = call["function"]["name"]
        out: list[Message] = [
            {
                "role": "tool",
                "tool_call_id": b.get("tool_use_id"),
                "name": names.get(b.get("tool_use_id"), "unknown"),
                "content": _text_of(b.get("content")),
            }
            for b in blocks
            if b.get("type") == "tool_result"
        ]
        if text or calls or not out:
            message: Message = {"role": role, "content": text}
            if calls:
                message["tool_calls"] = calls
            out.append(message)
        return out


READERS: dict[str, Any] = {
    "captured": Captured,
    "chat": _Chat,
    "responses": _Responses,
    "messages": _Messages,
}
