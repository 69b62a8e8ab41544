"""`HarnessRolloutOutcome`: what a reward function sees, built from a TrainingTrace.

Our capture proxy stores every turn in one chat form whatever the agent spoke (`metadata
["dialect"]` says which): `request.messages` holds only the messages this call added after its
parent's request and reply (`metadata["parent_id"]`), `response.message` the assistant message.
Anthropic `is_error: true` tool results arrive as chat tool messages prefixed `[tool error]`.
The full transcript of a turn is rebuilt by walking its parents.

Traces from other producers (OpenEnv's capture, TRL) keep the wire shapes, so one reader per
dialect turns those into the same few numbers:

    dialect     tool call (in a turn's response)      tool result (in a later turn's request)
    chat        choices[0].message.tool_calls[]        {"role": "tool", "tool_call_id", "content"}
    responses   output[] function_call / custom_tool_call / local_shell_call
                                                       input[] *_call_output {"call_id", "output"}
    messages    content[] {"type": "tool_use"}         user content[] {"type": "tool_result",
                                                         "tool_use_id", "content", "is_error"}

Counting rules (the seed's, TRL 1.16 `_tool_failures_by_name`, made dialect-neutral):
- tool_call_count / tool_calls_by_name: every tool call in every non-aux turn's response.
- A tool result is a failure when the agent's own record says so (Anthropic `is_error: true`,
  a Responses output whose `success` is false or whose metadata `exit_code` is non-zero,
  mini-swe-agent's `{"returncode": N}` with N != 0), else when its text contains
  error, failed, traceback or exception (any case). Each distinct (tool, first 200 chars of
  text) is counted once, across all turns: a transcript resent on every call must not count one
  failure once per turn.
- completion: the last non-aux turn's request transcript plus its reply, normalised to chat
  message dicts (role, content, tool_calls, tool_call_id) whatever the dialect, so a reward
  function reads one shape.

Aux turns (title, summary, compaction, token counting; `metadata["aux"]`) carry no agent work
and are skipped for counting and for the completion; they stay in `trace`.

This module never scores: `env_reward` is whatever the task's verifier produced (None =
unscored), and the field names match TRL 1.16's `HarnessRolloutOutcome` exactly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openenv.core.harness.training import TrainingTrace

__all__ = ["HarnessRolloutOutcome", "ToolResult", "build_outcome", "dialect_of"]

Message = dict[str, Any]
_FAILURE_WORDS = ("error", "failed", "traceback", "exception")
_RETURNCODE = re.compile(r"<returncode>\s*(-?\d+)\s*</returncode>")


@dataclass
class HarnessRolloutOutcome:
    """Same fields, same order as `trl.experimental.async_grpo.openenv_harness.HarnessRolloutOutcome`."""

    env_reward: float | None
    completion: list[Message]
    trace: list[dict[str, Any]]
    tool_call_count: int
    tool_failure_count: int
    tool_calls_by_name: dict[str, int]
    timed_out: bool


@dataclass(frozen=True)
class ToolResult:
    """One tool result as the agent recorded it: tool name, text, and its own error flag."""

    name: str
    text: str
    flagged_error: bool


def dialect_of(
    turn_metadata: dict[str, Any], request: dict[str, Any], response: dict[str, Any]
) -> str:
    """The turn's dialect: the proxy's `metadata["dialect"]`, else guessed from the shapes."""
    dialect = turn_metadata.get("dialect")
    if dialect in ("chat", "responses", "messages"):
        return dialect
    if "input" in request or "output" in response:
        return "responses"
    if "choices" in response:
        return "chat"
    return "messages"


def build_outcome(
    trace: TrainingTrace | None, *, env_reward: float | None, timed_out: bool
) -> HarnessRolloutOutcome:
    """Build the outcome of one rollout from its captured trace and its verifier reward."""
    entries = trace.to_trace_entries() if trace is not None else []
    by_id = {(e.get("metadata") or {}).get("node_id"): e for e in entries}
    calls: dict[str, int] = {}
    names: dict[Any, str] = {}  # tool call id -> tool name, across turns
    seen: set[tuple[str, str]] = set()
    failures = 0
    last: dict[str, Any] | None = None
    for entry in entries:
        metadata = entry.get("metadata") or {}
        if metadata.get("aux"):
            continue
        request, response = entry.get("request") or {}, entry.get("response") or {}
        reader = _READERS[_shape_of(metadata, request, response)]
        for call_id, name in reader.calls(response):
            names[call_id] = name
            calls[name] = calls.get(name, 0) + 1
        for result in reader.results(request, names):
            key = (result.name, result.text[:200])
            if key in seen:
                continue
            seen.add(key)
            if result.flagged_error or _text_says_failure(result.text):
                failures += 1
        last = entry
    return HarnessRolloutOutcome(
        env_reward=env_reward,
        completion=_completion(last, by_id) if last is not None else [],
        trace=entries,
        tool_call_count=sum(calls.values()),
        tool_failure_count=failures,
        tool_calls_by_name=calls,
        timed_out=timed_out,
    )


def _shape_of(metadata: dict[str, Any], request: dict[str, Any], response: dict[str, Any]) -> str:
    if "message" in response or "n_messages" in request:
        return "captured"
    return dialect_of(metadata, request, response)


def _completion(entry: dict[str, Any], by_id: dict[Any, dict[str, Any]]) -> list[Message]:
    """The turn's full transcript plus its reply, as chat messages."""
    metadata = entry.get("metadata") or {}
    request, response = entry.get("request") or {}, entry.get("response") or {}
    shape = _shape_of(metadata, request, response)
    if shape != "captured":
        reader = _READERS[shape]
        return reader.transcript(request) + reader.reply(response)
    chain = [entry]
    parent = by_id.get(metadata.get("parent_id"))
    while parent is not None and parent not in chain:  # parents first; a cycle cannot loop us
        chain.insert(0, parent)
        parent = by_id.get((parent.get("metadata") or {}).get("parent_id"))
    messages: list[Message] = []
    for turn in chain:
        messages.extend(dict(m) for m in (turn.get("request") or {}).get("messages") or [])
        messages.extend(_Captured.reply(turn.get("response") or {}))
    return messages


def _text_says_failure(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _FAILURE_WORDS)


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


def _record_failed(text: str) -> bool:
    """The agent's own exit-code record says the command failed.

    mini-swe-agent 2.x writes {"returncode": N, "output": ...} (1.x: <returncode>N</returncode>);
    Codex's JSON tool output carries {"metadata": {"exit_code": N}}. N != 0 is a failure.
    """
    match = _RETURNCODE.search(text)
    if match is not None:
        return int(match.group(1)) != 0
    if not text.lstrip().startswith("{"):
        return False
    try:
        parsed = json.loads(text)
    except ValueError:
        return False
    if not isinstance(parsed, dict):
        return False
    code = parsed.get("returncode", parsed.get("exit_code"))
    if code is None and isinstance(parsed.get("metadata"), dict):
        code = parsed["metadata"].get("exit_code")
    return isinstance(code, int) and not isinstance(code, bool) and code != 0


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
            name = m.get("name") or names.get(m.get("tool_call_id")) or "unknown"
            # "[tool error]" is how our proxy renders an Anthropic `is_error: true` result.
            flagged = text.startswith("[tool error]") or _record_failed(text)
            out.append(ToolResult(name, text, flagged))
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


class _Captured(_Chat):
    """Our capture proxy's chat form, any dialect: `response.message`, delta `request.messages`."""

    @staticmethod
    def calls(response: dict[str, Any]) -> list[tuple[Any, str]]:
        return _tool_calls(response.get("message") or {})

    @staticmethod
    def reply(response: dict[str, Any]) -> list[Message]:
        message = response.get("message")
        return [dict(message)] if isinstance(message, dict) else []


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
            flagged = False
            if isinstance(output, dict):
                flagged = output.get("success") is False
                output = output.get("content", output)
            text = _text_of(output)
            flagged = flagged or _record_failed(text)
            out.append(ToolResult(names.get(item.get("call_id"), "unknown"), text, flagged))
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
                b.get("is_error") is True,
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


_READERS: dict[str, Any] = {
    "captured": _Captured,
    "chat": _Chat,
    "responses": _Responses,
    "messages": _Messages,
}
