"""Responses API request -> chat request: input items become chat messages, tools become functions.

The Responses API describes a conversation as a flat list of items; chat groups them into
messages. The grouping rule mirrors what `responses.from_chat` emits for one engine reply,
`[reasoning] [message] [function_call ...]`, so the history Codex sends back regroups into the
very assistant message the engine produced:

- a `reasoning` item, an assistant `message` and the `function_call`s after them merge into one
  assistant chat message (reasoning, content, tool_calls), until a non-assistant item
  arrives or a second reasoning/text item starts a new turn;
- each `function_call_output` (and custom/local_shell output) becomes one `tool` message;
- `instructions` becomes the first system message; `developer` messages become system messages.

Tools (Codex 0.171 sends, measured: eight `function` tools, one `namespace` tool holding five
functions, one `web_search` tool):
- `function` -> chat function (`strict` kept);
- `namespace` -> its functions, flattened; the reply names the namespace again;
- `custom` (freeform, e.g. apply_patch) -> a function taking one string `input`, the grammar
  quoted in its description; replies become `custom_tool_call` items;
- `local_shell` -> a function `local_shell(command: string[], workdir?, timeout_ms?)`; replies
  become `local_shell_call` items;
- hosted tools the engine cannot run (`web_search`, `file_search`, `image_generation`,
  `code_interpreter`, `computer_use_preview`, `mcp`, ...) are dropped: no model behind this
  proxy can call them, and refusing them would stop Codex, which always offers web_search.

Refused with DialectError: `previous_response_id` and `item_reference` (this proxy keeps no
response store; Codex sends `store: false` and the full history), `input_file` parts, unknown
item types.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from .base import (
    ENGINE_REASONING_FIELD,
    DialectError,
    arguments_json,
    copy_sampling,
    optional_int,
    order_tool_results,
    require,
    require_body,
)
from .memo import TranslationMemo

__all__ = ["ToolRoute", "decode_reasoning", "encode_reasoning", "responses_to_chat", "tool_routes",
           "translate_tools"]

# Hosted tool types: dropped (see module docstring).
_HOSTED_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search",
     "image_generation", "code_interpreter", "computer_use_preview", "computer_use", "mcp",
     "tool_search"}
)
_REASONING_MARK = "hxr1:"

_LOCAL_SHELL_PARAMETERS = {
    "type": "object",
    "properties": {
        "command": {"type": "array", "items": {"type": "string"},
                    "description": "argv of the command to run"},
        "workdir": {"type": "string", "description": "working directory"},
        "timeout_ms": {"type": "integer", "description": "timeout in milliseconds"},
    },
    "required": ["command"],
}


@dataclass(frozen=True)
class ToolRoute:
    """How a chat tool call maps back to a Responses output item."""

    kind: str  # "function" | "custom" | "local_shell"
    name: str  # the name the agent declared
    namespace: str | None = None


def encode_reasoning(text: str) -> str:
    """Reasoning text as `encrypted_content`, so Codex hands it back verbatim next turn."""
    return _REASONING_MARK + base64.b64encode(text.encode("utf-8", "surrogatepass")).decode()


def decode_reasoning(blob: Any) -> str | None:
    """Inverse of encode_reasoning; None for content we did not write (a real provider's)."""
    if not isinstance(blob, str) or not blob.startswith(_REASONING_MARK):
        return None
    try:
        raw = base64.b64decode(blob[len(_REASONING_MARK):], validate=True)
        return raw.decode("utf-8", "surrogatepass")
    except (ValueError, UnicodeDecodeError):
        return None


def _function(name: str, description: Any, parameters: Any, strict: Any = None) -> dict:
    function: dict[str, Any] = {"name": name}
    if isinstance(description, str):
        function["description"] = description
    function["parameters"] = parameters if isinstance(parameters, dict) else {
        "type": "object", "properties": {}}
    if isinstance(strict, bool):
        function["strict"] = strict
    return {"type": "function", "function": function}


def _custom_description(tool: dict) -> str:
    description = tool.get("description") if isinstance(tool.get("description"), str) else ""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        description += (
            f"\n\nThe `input` string must follow this {fmt.get('syntax', 'grammar')} grammar:\n"
            f"{fmt.get('definition', '')}"
        )
    return description


def translate_tools(tools: Any, *, build: bool = True) -> tuple[list[dict], dict[str, ToolRoute]]:
    """Responses tools -> (chat tools, chat name -> route back); `build=False`: routes only."""
    if tools is None:
        return [], {}
    require(tools, list, "tools")
    chat_tools: list[dict] = []
    routes: dict[str, ToolRoute] = {}

    def add(chat_name: str, route: ToolRoute, tool: dict) -> None:
        if chat_name in routes and route.namespace is not None:
            chat_name = f"{route.namespace}__{chat_name}"
        if chat_name in routes:
            raise DialectError(f"tools declares {chat_name!r} twice")
        routes[chat_name] = route
        if not build:
            return
        if route.kind == "custom":
            chat_tools.append(_function(chat_name, _custom_description(tool), {
                "type": "object", "properties": {"input": {"type": "string"}},
                "required": ["input"]}))
        elif route.kind == "local_shell":
            chat_tools.append(_function(chat_name, tool.get("description")
                                        or "Run a command on the local machine.",
                                        _LOCAL_SHELL_PARAMETERS))
        else:
            chat_tools.append(_function(chat_name, tool.get("description"),
                                        tool.get("parameters"), tool.get("strict")))

    for i, tool in enumerate(tools):
        require(tool, dict, f"tools[{i}]")
        kind = require(tool.get("type"), str, f"tools[{i}].type")
        if kind in _HOSTED_TOOLS:
            continue
        if kind == "function":
            name = require(tool.get("name"), str, f"tools[{i}].name")
            add(name, ToolRoute("function", name), tool)
        elif kind == "namespace":
            namespace = require(tool.get("name"), str, f"tools[{i}].name")
            members = require(tool.get("tools"), list, f"tools[{i}].tools")
            for j, member in enumerate(members):
                where = f"tools[{i}].tools[{j}]"
                require(member, dict, where)
                if member.get("type", "function") != "function":
                    raise DialectError(f"{where}.type must be 'function'")
                name = require(member.get("name"), str, f"{where}.name")
                add(name, ToolRoute("function", name, namespace), member)
        elif kind == "custom":
            name = require(tool.get("name"), str, f"tools[{i}].name")
            add(name, ToolRoute("custom", name), tool)
        elif kind == "local_shell":
            add("local_shell", ToolRoute("local_shell", "local_shell"), tool)
        else:
            raise DialectError(
                f"tools[{i}].type {kind!r} is not supported: use function, namespace, custom "
                "or local_shell tools"
            )
    return chat_tools, routes


def tool_routes(request: dict) -> dict[str, ToolRoute]:
    """Chat tool name -> route back, for a request that already passed `responses_to_chat`."""
    try:
        return translate_tools(request.get("tools"), build=False)[1]
    except DialectError:
        return {}


def _chat_name(routes: dict[str, ToolRoute], name: str, namespace: Any) -> str:
    """The chat name `translate_tools` gave a (namespace, name) pair."""
    if not isinstance(namespace, str):
        return name
    route = routes.get(name)
    if route is not None and route.namespace == namespace:
        return name
    return f"{namespace}__{name}"


def _content(content: Any, where: str) -> str | list[dict]:
    """Responses content (string or parts) -> chat content; text-only becomes one string."""
    if isinstance(content, str):
        return content
    require(content, list, where)
    parts: list[dict] = []
    for i, part in enumerate(content):
        require(part, dict, f"{where}[{i}]")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text", "summary_text", "reasoning_text"):
            parts.append({"type": "text", "text": require(part.get("text"), str,
                                                          f"{where}[{i}].text")})
        elif kind == "refusal":
            parts.append({"type": "text", "text": require(part.get("refusal"), str,
                                                          f"{where}[{i}].refusal")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise DialectError(
                    f"{where}[{i}]: only input_image parts with an image_url are supported "
                    "(no file_id: this proxy keeps no file store)")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise DialectError(f"{where}[{i}].type {kind!r} is not supported")
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def _reasoning(item: dict, where: str) -> str:
    content = item.get("content")
    if isinstance(content, list) and content:
        text = _content(content, f"{where}.content")
        if isinstance(text, str) and text:
            return text
    decoded = decode_reasoning(item.get("encrypted_content"))
    if decoded is not None:
        return decoded
    summary = item.get("summary")
    if isinstance(summary, list) and summary:
        text = _content(summary, f"{where}.summary")
        if isinstance(text, str):
            return text
    return ""


def _local_shell_arguments(action: Any, where: str) -> str:
    action = require(action, dict, f"{where}.action")
    args: dict[str, Any] = {"command": require(action.get("command"), list,
                                               f"{where}.action.command")}
    if isinstance(action.get("working_directory"), str):
        args["workdir"] = action["working_directory"]
    if isinstance(action.get("timeout_ms"), int):
        args["timeout_ms"] = action["timeout_ms"]
    return arguments_json(args)


class _Builder:
    """Accumulates chat messages; holds the open assistant turn until it is complete."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.turn: dict | None = None

    def assistant(self) -> dict:
        if self.turn is None:
            self.turn = {"role": "assistant", "content": None}
        return self.turn

    def close(self) -> None:
        if self.turn is not None:
            self.messages.append(self.turn)
            self.turn = None

    def add(self, message: dict) -> None:
        self.close()
        self.messages.append(message)

    def tool_call(self, call_id: Any, name: str, arguments: str, where: str) -> None:
        require(call_id, str, f"{where}.call_id")
        self.assistant().setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )

    def tool_result(self, item: dict, where: str) -> None:
        call_id = require(item.get("call_id"), str, f"{where}.call_id")
        output = item.get("output", "")
        content = output if isinstance(output, str) else _content(output, f"{where}.output")
        self.add({"role": "tool", "tool_call_id": call_id, "content": content})


def _input_to_messages(items: list, routes: dict[str, ToolRoute]) -> list[dict]:
    b = _Builder()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        require(item, dict, where)
        kind = item.get("type", "message")
        if kind == "message":
            role = require(item.get("role"), str, f"{where}.role")
            content = _content(item.get("content"), f"{where}.content")
            if role == "assistant":
                turn = b.turn
                if turn is not None and (turn.get("content") is not None or "tool_calls" in turn):
                    b.close()
                b.assistant()["content"] = content
            elif role in ("user", "system", "developer"):
                b.add({"role": "system" if role == "developer" else role, "content": content})
            else:
                raise DialectError(f"{where}.role {role!r} is not one of user, assistant, "
                                   "system, developer")
        elif kind == "reasoning":
            if b.turn is not None:
                b.close()
            text = _reasoning(item, where)
            if text:
                b.assistant()[ENGINE_REASONING_FIELD] = text
        elif kind == "function_call":
            name = require(item.get("name"), str, f"{where}.name")
            arguments = require(item.get("arguments", ""), str, f"{where}.arguments")
            b.tool_call(item.get("call_id"), _chat_name(routes, name, item.get("namespace")),
                        arguments, where)
        elif kind == "custom_tool_call":
            name = require(item.get("name"), str, f"{where}.name")
            text = require(item.get("input", ""), str, f"{where}.input")
            b.tool_call(item.get("call_id"), name, arguments_json({"input": text}), where)
        elif kind == "local_shell_call":
            b.tool_call(item.get("call_id"), "local_shell",
                        _local_shell_arguments(item.get("action"), where), where)
        elif kind in ("function_call_output", "custom_tool_call_output",
                      "local_shell_call_output"):
            b.tool_result(item, where)
        elif kind in ("web_search_call", "image_generation_call"):
            # Hosted-tool results this proxy never produces; nothing to render.
            continue
        elif kind == "item_reference":
            raise DialectError(f"{where}: item_reference needs a response store, which this "
                               "proxy does not keep; send the full item (store: false)")
        else:
            raise DialectError(f"{where}.type {kind!r} is not supported")
    b.close()
    return b.messages


def responses_to_chat(body: dict, memo: TranslationMemo | None = None) -> dict:
    """The whole request translation (see module docstring).

    With a `memo` (dialects.memo) the tool manifest is translated once per session while it stays
    the same. The input items are translated whole on every call: unlike chat or Anthropic
    messages they do not translate one by one (a `function_call` item joins the assistant
    message its neighbours build), so the memo's per-item contract does not hold for them.
    """
    body = require_body(body)
    if body.get("previous_response_id") is not None:
        raise DialectError("previous_response_id is not supported: this proxy keeps no "
                           "response store; send the full history in input (store: false)")
    chat_tools, routes = (translate_tools(body.get("tools")) if memo is None
                          else memo.value("responses.tools", body.get("tools"), translate_tools))
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        system = _content(instructions, "instructions")
        if system:  # Codex sends none; an empty one must not add an empty system turn
            messages.append({"role": "system", "content": system})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    else:
        messages.extend(_input_to_messages(require(raw, list, "input"), routes))
    if not messages:
        raise DialectError("input must not be empty")

    out: dict[str, Any] = {"messages": order_tool_results(messages)}
    if isinstance(body.get("model"), str):
        out["model"] = body["model"]
    copy_sampling(body, out, ("temperature", "top_p"))
    max_tokens = optional_int(body, "max_output_tokens")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    if chat_tools:
        out["tools"] = chat_tools
        choice = _tool_choice(body.get("tool_choice"), routes)
        if choice is not None:
            out["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            out["parallel_tool_calls"] = body["parallel_tool_calls"]
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        out["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        out["response_format"] = {"type": "json_object"}
    stream = body.get("stream")
    if stream is not None and require(stream, bool, "stream"):
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    return out


def _tool_choice(choice: Any, routes: dict[str, ToolRoute]) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        name = choice.get("name")
        if kind in ("function", "custom") and isinstance(name, str):
            return {"type": "function", "function": {"name": name}}
        if kind == "local_shell":
            return {"type": "function", "function": {"name": "local_shell"}}
        if kind == "allowed_tools":
            return "required" if choice.get("mode") == "required" else "auto"
        if isinstance(kind, str) and kind in _HOSTED_TOOLS:
            return "auto"
    raise DialectError(f"tool_choice {choice!r} is not supported")
