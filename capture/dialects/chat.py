"""OpenAI Chat Completions: the engine's own language, passed through with care.

Wire facts
- Route: `POST {base}/chat/completions` (base = `.../s/{session}/v1`). Models probe: `GET /models`.
- Speakers: opencode (streaming, via `@ai-sdk/openai-compatible`; sends
  `stream_options.include_usage`), mini-swe-agent (non-streaming, via litellm). opencode fires a
  title-generator call first (no tools, a short "generate a title" system prompt): an aux call
  the core tags, the dialect just translates it.
- Streaming: bare `data: {chat.completion.chunk}` lines, then `data: [DONE]`. The first chunk
  carries `delta.role`; tool calls arrive as `delta.tool_calls[i]` fragments (the first with
  `id`, `type` and `function.name`, later ones `function.arguments` pieces); the chunk with
  `finish_reason` closes the choice; with `include_usage` a last chunk has `choices: []` and
  `usage`. A mid-stream error is `data: {"error": {...}}`.

What changes on the way in (what vLLM 0.32 rejects or mis-renders):
- `tools: []` is a 400 in vLLM: dropped, together with a `tool_choice` that has no tools left.
- `stream_options` without `stream` is a 400: dropped.
- `role: "developer"` (OpenAI's newer name for system) becomes `system`; chat templates such as
  the ChatML/Qwen ones know only system/user/assistant/tool.
- legacy `functions` / `function_call` become `tools` / `tool_choice`.
- tool-call `arguments` sent as an object (some clients do) become the JSON string vLLM expects
  (vLLM parses it back to an object for the template, so spacing does not matter).
- streaming always asks for `include_usage`; the agent only sees the usage chunk if it asked.
- `n` other than 1 is refused: the proxy records one sample per call.
- an assistant message's `reasoning_content` (DeepSeek's and older vLLM's name, what litellm and
  other clients send back) becomes `reasoning`, the field vLLM 0.32 renders (base.py
  ENGINE_REASONING_FIELD); when both are sent, `reasoning` wins, as in vLLM.
- `max_completion_tokens` (newer OpenAI clients) becomes `max_tokens`, the one field the
  core's sampling policy caps.

A stop at the proxy's token cap stays `finish_reason: "length"` here: both chat agents take
it in their stride (opencode ends the step; mini-swe-agent tells the model its output hit the
limit, a useful signal), unlike Codex and Claude Code, whose dialects soften it.

What changes on the way out: engine-only fields are stripped (`prompt_token_ids`,
`choices[].token_ids`, `prompt_logprobs`, `kv_transfer_params`, vLLM's `stop_reason`), and
`logprobs` unless the agent asked for them; `model` is the name the agent asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import (
    ENGINE_REASONING_FIELD,
    Dialect,
    DialectError,
    StreamEncoder,
    arguments_json,
    require,
    require_body,
    sse_data,
)
from .memo import TranslationMemo, translate_items

__all__ = ["ChatDialect", "ChatStreamEncoder", "openai_error"]

# Top-level keys of an engine reply/chunk that only the capture core wants.
_ENGINE_ONLY = frozenset(
    {"prompt_token_ids", "prompt_logprobs", "prompt_text", "kv_transfer_params",
     "ec_transfer_params", "metrics"}
)
# Per-choice keys that only the capture core wants.
_CHOICE_ENGINE_ONLY = frozenset({"token_ids", "stop_reason", "routed_experts"})


def openai_error(status: int, message: str) -> dict:
    """OpenAI's error body (shared by Chat Completions and Responses)."""
    kind = {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "invalid_request_error",
        429: "rate_limit_error",
    }.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def _normalise_tool_calls(calls: Any, message_index: int) -> list[dict] | None:
    """A message's tool calls checked, with object arguments written as the JSON string vLLM
    expects; None when none needed rewriting. (Here and in `_normalise_message`, an error's path
    is formatted only once a check has failed: these run on every new message of every call,
    ahead of the engine.)"""
    where = "messages[{}].tool_calls{}"
    if not isinstance(calls, list):
        require(calls, list, where.format(message_index, ""))
    out = None
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            require(call, dict, where.format(message_index, f"[{i}]"))
            require(function, dict, where.format(message_index, f"[{i}].function"))
            require(function.get("name"), str, where.format(message_index, f"[{i}].function.name"))
        arguments = function.get("arguments", "")
        if isinstance(arguments, str):
            continue
        if not isinstance(arguments, dict | list):
            require(arguments, str, where.format(message_index, f"[{i}].function.arguments"))
        out = out if out is not None else list(calls)
        out[i] = {**call, "function": {**function, "arguments": arguments_json(arguments)}}
    return out


def _normalise_messages(messages: Any, memo: TranslationMemo | None) -> list[dict]:
    require(messages, list, "messages")
    if not messages:
        raise DialectError("messages must not be empty")
    return translate_items(memo, "chat.messages", messages, _normalise_message)


def _normalise_message(i: int, message: Any) -> list[dict]:
    """One message, checked and normalised; depends on nothing but itself (memo contract)."""
    if not isinstance(message, dict):
        require(message, dict, f"messages[{i}]")
    role = message.get("role")
    if not isinstance(role, str):
        require(role, str, f"messages[{i}].role")
    content = message.get("content")
    if content is not None and not isinstance(content, str | list):
        require(content, (str, list), f"messages[{i}].content")
    if role == "developer":
        message = {**message, "role": "system"}
    elif role not in ("system", "user", "assistant", "tool", "function"):
        raise DialectError(
            f"messages[{i}].role {role!r} is not one of system, developer, user, "
            "assistant, tool"
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        require(message.get("tool_call_id"), str, f"messages[{i}].tool_call_id")
    if role == "assistant" and "reasoning_content" in message:
        message = _reasoning_field(message)
    calls = message.get("tool_calls")
    if calls is not None:
        rewritten = _normalise_tool_calls(calls, i)
        if not calls:
            message = _without(message, "tool_calls")
        elif rewritten is not None:
            message = {**message, "tool_calls": rewritten}
    return [message]


def _reasoning_field(message: dict) -> dict:
    """An assistant message's earlier reasoning under the name vLLM renders (base.py
    ENGINE_REASONING_FIELD). vLLM itself keeps `reasoning` and drops `reasoning_content` when a
    message has both; so does this, so the forwarded request is what the engine renders."""
    out = _without(message, "reasoning_content")
    if out.get(ENGINE_REASONING_FIELD) is None and message["reasoning_content"] is not None:
        out[ENGINE_REASONING_FIELD] = message["reasoning_content"]
    return out


def _check_tools(tools: Any) -> list:
    require(tools, list, "tools")
    for i, tool in enumerate(tools):
        require(tool, dict, f"tools[{i}]")
        if tool.get("type", "function") != "function":
            raise DialectError(
                f"tools[{i}].type {tool.get('type')!r} is not supported: the engine "
                "only runs function tools"
            )
        function = require(tool.get("function"), dict, f"tools[{i}].function")
        require(function.get("name"), str, f"tools[{i}].function.name")
    return tools


def _without(d: dict, *keys: str) -> dict:
    return {k: v for k, v in d.items() if k not in keys}


class ChatDialect(Dialect):
    """Chat Completions in, Chat Completions out: normalise, forward, strip engine fields."""

    name = "chat"

    def to_chat(self, body: dict, memo: TranslationMemo | None = None) -> dict:
        body = require_body(body)
        out = dict(body)
        out["messages"] = _normalise_messages(body.get("messages"), memo)
        if body.get("max_completion_tokens") is not None:
            limit = require(body["max_completion_tokens"], int, "max_completion_tokens")
            out.pop("max_completion_tokens")
            out.setdefault("max_tokens", limit)
        n = body.get("n")
        if n is not None and n != 1:
            raise DialectError(f"n must be 1 (the capture proxy records one sample), got {n!r}")

        if body.get("functions") is not None and body.get("tools") is None:
            functions = require(body["functions"], list, "functions")
            out["tools"] = [{"type": "function", "function": f} for f in functions]
            call = body.get("function_call")
            if isinstance(call, dict):
                out["tool_choice"] = {"type": "function", "function": call}
            elif call in ("auto", "none"):
                out["tool_choice"] = call
        out.pop("functions", None)
        out.pop("function_call", None)

        tools = out.get("tools")
        if tools is not None:
            if memo is None:
                _check_tools(tools)
            else:  # an agent sends the same manifest every call: checked once per session
                memo.value("chat.tools", tools, _check_tools)
        if not tools:
            # vLLM rejects `tools: []` and a tool_choice without tools.
            out.pop("tools", None)
            out.pop("tool_choice", None)
            out.pop("parallel_tool_calls", None)

        stream = body.get("stream")
        if stream is not None:
            require(stream, bool, "stream")
        if stream:
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            options["include_usage"] = True
            out["stream_options"] = options
        else:
            out.pop("stream_options", None)
        return out

    def message_translator(self) -> Callable[[int, Any], list[dict]]:
        # One message in, one out; the rest of a resent request is its last one's bytes.
        return _normalise_message

    def from_chat(self, chat: dict, request: dict) -> dict:
        wants_logprobs = bool(request.get("logprobs"))
        out = {k: v for k, v in chat.items() if k not in _ENGINE_ONLY}
        if isinstance(request.get("model"), str):
            out["model"] = request["model"]
        choices = chat.get("choices")
        if isinstance(choices, list):
            out["choices"] = [_clean_choice(c, wants_logprobs) for c in choices]
        return out

    def stream_encoder(self, request: dict) -> ChatStreamEncoder:
        return ChatStreamEncoder(request)

    def error_body(self, status: int, message: str) -> dict:
        return openai_error(status, message)


def _clean_choice(choice: Any, keep_logprobs: bool) -> Any:
    if not isinstance(choice, dict):
        return choice
    drop = _CHOICE_ENGINE_ONLY if keep_logprobs else _CHOICE_ENGINE_ONLY | {"logprobs"}
    return {k: v for k, v in choice.items() if k not in drop}


class ChatStreamEncoder(StreamEncoder):
    """Chunks pass through with engine fields stripped; one small dict copy per chunk."""

    def __init__(self, request: dict) -> None:
        self._model = request.get("model") if isinstance(request.get("model"), str) else None
        self._logprobs = bool(request.get("logprobs"))
        options = request.get("stream_options")
        self._usage = isinstance(options, dict) and bool(options.get("include_usage"))
        self._failed = False

    def on_chunk(self, chunk: dict) -> bytes:
        if self._failed:
            return b""
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {}
            return self.fail(str(error.get("message") or chunk["error"]))
        choices = chunk.get("choices")
        if not choices and not self._usage:
            # The usage-only chunk the proxy asked for on the agent's behalf.
            return b""
        out = {k: v for k, v in chunk.items() if k not in _ENGINE_ONLY}
        if self._model is not None:
            out["model"] = self._model
        if isinstance(choices, list) and choices:
            out["choices"] = [_clean_choice(c, self._logprobs) for c in choices]
        if not self._usage:
            out.pop("usage", None)
        return sse_data(out)

    def finish(self) -> bytes:
        return b"" if self._failed else sse_data("[DONE]")

    def fail(self, message: str) -> bytes:
        if self._failed:
            return b""
        self._failed = True
        return sse_data(openai_error(500, message))
