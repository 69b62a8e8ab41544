"""Anthropic Messages request -> chat request.

Mapping, block by block, in the order the agent sent them:
- `system` (a string, or text blocks joined with "\\n") -> the first system message. Claude
  Code 2.1 also puts `role: "system"` messages inside `messages` (its environment block,
  measured): they stay system messages at their place.
- user `text` / `image` blocks -> one user message (text-only becomes a string; images become
  `image_url` data/URL parts, and a text-only engine rejects them with its own 400);
- user `tool_result` blocks -> one `tool` message each, content flattened to text (image
  blocks inside become parts), put in the order of the calls they answer (Claude Code 2.1 was
  measured sending two results in reverse order; see `base.order_tool_results`);
  `is_error: true` prefixes the text with `[tool error] ` because chat has no error flag and
  the model must see that the call failed;
- assistant `thinking` -> `reasoning` (the field vLLM 0.32 renders, base.py ENGINE_REASONING_FIELD); `redacted_thinking` is dropped (its payload is
  an opaque provider blob no engine can read); `text` -> content; `tool_use` -> `tool_calls`
  with `arguments = json.dumps(input, ensure_ascii=False)`. vLLM parses arguments back into an
  object before the chat template renders them, so their spacing never reaches the prompt
  (opencode, measured, re-serialises them compactly; the prompts still chain);
- `tools` with `input_schema` -> functions (`defer_loading` kept: vLLM knows it); Anthropic
  server tools (`web_search_*`, `code_execution_*`, `bash_*`, `text_editor_*`, ...) carry no
  schema an engine can call and are dropped;
- `tool_choice` auto/any/tool/none -> auto/required/named/none;
  `disable_parallel_tool_use` -> `parallel_tool_calls: false`;
- `max_tokens` (required, as the real API requires it) -> `max_tokens`; `stop_sequences` ->
  `stop`; temperature/top_p/top_k copied (the core's sampling policy overrides them).
`thinking`, `metadata`, `context_management`, `output_config` and `cache_control` are
provider controls with no engine meaning and are ignored.

The billing line Claude Code puts first in `system` (`x-anthropic-billing-header: ...`) is
kept, except a `cch=<hash>;` field, which some versions change on every request: it would make
each turn's prompt differ from the last one and break prefix chaining (OpenEnv measured this).
"""

from __future__ import annotations

import re
from typing import Any

from .base import (
    ENGINE_REASONING_FIELD,
    DialectError,
    arguments_json,
    copy_sampling,
    order_tool_results,
    require,
    require_body,
)
from .memo import TranslationMemo, translate_items

__all__ = ["messages_to_chat", "system_text"]

_CCH = re.compile(r"\s*cch=[^;\s]*;?")
_SERVER_TOOL = re.compile(r"^(web_search|web_fetch|code_execution|bash|text_editor|computer|"
                          r"memory|tool_search)")


def _text_blocks(blocks: Any, where: str) -> str:
    if isinstance(blocks, str):
        return blocks
    require(blocks, list, where)
    texts = []
    for i, block in enumerate(blocks):
        require(block, dict, f"{where}[{i}]")
        if block.get("type") != "text":
            raise DialectError(f"{where}[{i}].type must be 'text', got {block.get('type')!r}")
        texts.append(require(block.get("text"), str, f"{where}[{i}].text"))
    return "\n".join(texts)


def system_text(system: Any) -> str:
    """The `system` field as one string (billing `cch=` hash removed)."""
    text = _text_blocks(system, "system")
    if text.startswith("x-anthropic-billing-header:"):
        line, sep, rest = text.partition("\n")
        text = _CCH.sub("", line) + sep + rest
    return text


def _image_part(block: dict, where: str) -> dict:
    source = require(block.get("source"), dict, f"{where}.source")
    if source.get("type") == "base64":
        media = require(source.get("media_type"), str, f"{where}.source.media_type")
        data = require(source.get("data"), str, f"{where}.source.data")
        url = f"data:{media};base64,{data}"
    elif source.get("type") == "url":
        url = require(source.get("url"), str, f"{where}.source.url")
    else:
        raise DialectError(f"{where}.source.type {source.get('type')!r} is not supported "
                           "(base64 or url)")
    return {"type": "image_url", "image_url": {"url": url}}


def _parts_content(parts: list[dict]) -> str | list[dict]:
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _tool_result_content(block: dict, where: str) -> str | list[dict]:
    content = block.get("content", "")
    parts: list[dict] = []
    if isinstance(content, str):
        parts.append({"type": "text", "text": content})
    else:
        require(content, list, f"{where}.content")
        for i, inner in enumerate(content):
            at = f"{where}.content[{i}]"
            require(inner, dict, at)
            kind = inner.get("type")
            if kind == "text":
                parts.append({"type": "text", "text": require(inner.get("text"), str,
                                                              f"{at}.text")})
            elif kind == "image":
                parts.append(_image_part(inner, at))
            else:
                raise DialectError(f"{at}.type {kind!r} is not supported in a tool_result")
    if block.get("is_error") is True:
        if parts and parts[0]["type"] == "text":
            parts[0] = {"type": "text", "text": "[tool error] " + parts[0]["text"]}
        else:
            parts.insert(0, {"type": "text", "text": "[tool error]"})
    return _parts_content(parts)


def _user(content: list, where: str, out: list[dict], role: str) -> None:
    pending: list[dict] = []

    def flush() -> None:
        if pending:
            out.append({"role": role, "content": _parts_content(list(pending))})
            pending.clear()

    for i, block in enumerate(content):
        at = f"{where}[{i}]"
        require(block, dict, at)
        kind = block.get("type")
        if kind == "text":
            pending.append({"type": "text", "text": require(block.get("text"), str, f"{at}.text")})
        elif kind == "image":
            pending.append(_image_part(block, at))
        elif kind == "tool_result" and role == "user":
            flush()
            out.append({"role": "tool",
                        "tool_call_id": require(block.get("tool_use_id"), str,
                                                f"{at}.tool_use_id"),
                        "content": _tool_result_content(block, at)})
        elif kind == "document":
            raise DialectError(f"{at}: document blocks are not supported; send the text as a "
                               "text block")
        else:
            raise DialectError(f"{at}.type {kind!r} is not supported in a {role} message")
    flush()


def _assistant(content: list, where: str) -> dict | None:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[dict] = []
    for i, block in enumerate(content):
        at = f"{where}[{i}]"
        require(block, dict, at)
        kind = block.get("type")
        if kind == "text":
            texts.append(require(block.get("text"), str, f"{at}.text"))
        elif kind == "thinking":
            thinking.append(require(block.get("thinking"), str, f"{at}.thinking"))
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            tool_input = block.get("input", {})
            require(tool_input, dict, f"{at}.input")
            calls.append({"id": require(block.get("id"), str, f"{at}.id"), "type": "function",
                          "function": {"name": require(block.get("name"), str, f"{at}.name"),
                                       "arguments": arguments_json(tool_input)}})
        else:
            raise DialectError(f"{at}.type {kind!r} is not supported in an assistant message")
    if not (texts or thinking or calls):
        return None
    if texts:
        message["content"] = "".join(texts)
    if thinking:
        message[ENGINE_REASONING_FIELD] = "\n".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _messages(messages: Any, memo: TranslationMemo | None) -> list[dict]:
    require(messages, list, "messages")
    if not messages:
        raise DialectError("messages must not be empty")
    return translate_items(memo, "messages.messages", messages, _message)


def _message(i: int, message: Any) -> list[dict]:
    """One Anthropic message -> its chat messages; depends on nothing but itself (memo contract)."""
    where = f"messages[{i}]"
    require(message, dict, where)
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise DialectError(f"{where}.role must be 'user' or 'assistant', got {role!r}")
    content = message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    require(content, list, f"{where}.content")
    if role == "assistant":
        turn = _assistant(content, f"{where}.content")
        return [turn] if turn is not None else []
    out: list[dict] = []
    _user(content, f"{where}.content", out, role)
    return out


def _tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    require(tools, list, "tools")
    out = []
    for i, tool in enumerate(tools):
        require(tool, dict, f"tools[{i}]")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            if isinstance(kind, str) and _SERVER_TOOL.match(kind):
                continue
            raise DialectError(f"tools[{i}].type {kind!r} is not supported")
        function: dict[str, Any] = {"name": require(tool.get("name"), str, f"tools[{i}].name")}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        function["parameters"] = require(tool.get("input_schema"), dict,
                                         f"tools[{i}].input_schema")
        entry: dict[str, Any] = {"type": "function", "function": function}
        if isinstance(tool.get("defer_loading"), bool):
            entry["defer_loading"] = tool["defer_loading"]
        out.append(entry)
    return out


def _tool_choice(choice: Any, out: dict) -> None:
    if choice is None:
        return
    require(choice, dict, "tool_choice")
    kind = choice.get("type")
    if kind == "auto":
        out["tool_choice"] = "auto"
    elif kind == "any":
        out["tool_choice"] = "required"
    elif kind == "none":
        out["tool_choice"] = "none"
    elif kind == "tool":
        name = require(choice.get("name"), str, "tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise DialectError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}")
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False


def messages_to_chat(body: dict, *, need_max_tokens: bool = True,
                     memo: TranslationMemo | None = None) -> dict:
    """The whole request translation (see module docstring); `memo`: dialects.memo."""
    body = require_body(body)
    messages: list[dict] = []
    if body.get("system") is not None:
        system = system_text(body["system"])
        if system:
            messages.append({"role": "system", "content": system})
    messages.extend(_messages(body.get("messages"), memo))
    out: dict[str, Any] = {"messages": order_tool_results(messages)}
    if isinstance(body.get("model"), str):
        out["model"] = body["model"]
    max_tokens = body.get("max_tokens")
    if max_tokens is not None or need_max_tokens:
        require(max_tokens, int, "max_tokens")
        if max_tokens < 1:
            raise DialectError(f"max_tokens must be >= 1, got {max_tokens}")
        out["max_tokens"] = max_tokens
    copy_sampling(body, out, ("temperature", "top_p", "top_k"))
    stop = body.get("stop_sequences")
    if stop is not None:
        require(stop, list, "stop_sequences")
        out["stop"] = [require(s, str, f"stop_sequences[{i}]") for i, s in enumerate(stop)]
    tools = (_tools(body.get("tools")) if memo is None
             else memo.value("messages.tools", body.get("tools"), _tools))
    if tools:
        out["tools"] = tools
        _tool_choice(body.get("tool_choice"), out)
        if out.get("tool_choice") is None:
            out.pop("tool_choice", None)
    stream = body.get("stream")
    if stream is not None and require(stream, bool, "stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out
