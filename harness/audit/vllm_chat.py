"""What vLLM 0.32 does with a chat request's text, around the model: the scripted engine's half
that must match vLLM exactly.

Two directions: a request's messages and tools as vLLM hands them to the chat template
(vllm/renderers/chat_utils.py: content as lists of text parts, tool-call arguments parsed to
objects, Claude Code's billing header line dropped, tools as pydantic dumps them), and a
completion's text parsed into content and tool calls as vLLM's hermes parser does. The prompt ids
the scripted engine reports are only right if these are (tests/test_scripted_engine.py compares
them with vLLM's own /tokenize). scripted_engine.py serves them; this module has no server.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

__all__ = ["parse_hermes", "split_reasoning", "vllm_messages", "vllm_tools"]

# vLLM's hermes parser (vllm/tool_parsers/hermes_tool_parser.py): a closed call, or an unclosed
# one running to the end of the text.
_HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


def split_reasoning(text: str) -> tuple[str | None, str]:
    """(reasoning, the rest) of a completion's text, for a script that writes a think block, as
    vLLM's `qwen3` reasoning parser splits it: the text up to `</think>` (a leading `<think>`
    dropped, newlines kept: "<think>\\nplan\\n</think>" gives "\\nplan\\n") is reasoning, what
    follows is parsed for content and tool calls (measured with vLLM 0.32's composed hermes +
    qwen3 parser on the thinking model's tokenizer). Not emulated:
    qwen3's implicit end (text before a `<tool_call>` with no `</think>` is reasoning too, what
    the tiny model's own replies get, tests/test_thinking_engine.py); a reply without
    `</think>` is all content here."""
    if "</think>" not in text:
        return None, text
    reasoning, rest = text.split("</think>", 1)
    return reasoning.removeprefix("<think>"), rest


def parse_hermes(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, tool calls) of a completion's text, as vLLM's hermes parser returns them."""
    if "<tool_call>" not in text:
        return text, []
    try:
        calls = []
        for closed, unclosed in _HERMES_CALL.findall(text):
            call = json.loads(closed or unclosed)
            calls.append(
                {
                    "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
                    "type": "function",
                    "function": {
                        "name": call["name"],
                        "arguments": json.dumps(call["arguments"], ensure_ascii=False),
                    },
                }
            )
    except (ValueError, KeyError, TypeError):
        return text, []  # vLLM logs the failure and returns the whole text as content
    content = text[: text.find("<tool_call>")]
    return content or None, calls


_TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
_BILLING_HEADER = "x-anthropic-billing-header"  # Claude Code's per-request line vLLM drops


def _text_parts(content: Any, role: str) -> list[dict[str, str]]:
    """A message's content as vLLM 0.32 hands it to this template ("openai" content format:
    a list of text parts, which the template concatenates; vllm/renderers/chat_utils.py)."""
    if content is None:
        return []
    parts = [content] if isinstance(content, str) else list(content)
    out = []
    for part in parts:
        if isinstance(part, str):
            text: Any = part
        elif isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
            text = part.get(_TEXT_PARTS[part["type"]], part.get("text"))
        else:
            continue  # images and the like: the tiny model has no use for them
        if not isinstance(text, str):
            continue
        if role == "system" and text.startswith(_BILLING_HEADER):
            text = text.partition("\n")[2]
            if not text:
                continue
        out.append({"type": "text", "text": text})
    return out


def _arguments(value: Any) -> dict[str, Any]:
    """A tool call's arguments as vLLM passes them to the template: an object; a string that is
    not a JSON object becomes {} (vLLM coerces it rather than fail every later turn)."""
    if isinstance(value, dict):
        return value
    if not value or not isinstance(value, str):
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def vllm_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as vLLM passes them to the chat template (chat_utils' parse + postprocess)."""
    out = []
    for message in messages:
        role = message["role"]
        content: Any = _text_parts(message.get("content"), role)
        if role == "tool" and isinstance(message.get("content"), list):
            content = "\n".join(part["text"] for part in content)  # vLLM joins a tool's parts
        rendered: dict[str, Any] = {"role": role, "content": content}
        calls = message.get("tool_calls")
        if role == "assistant" and calls:
            rendered["tool_calls"] = [
                {
                    **call,
                    "function": {
                        **call["function"],
                        "arguments": _arguments(call["function"].get("arguments")),
                    },
                }
                for call in calls
            ]
        # vLLM's request validator renames `reasoning_content` to `reasoning` when `reasoning` is
        # absent (ChatCompletionRequest._normalize_messages_before); the template gets both names
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if role == "assistant" and isinstance(reasoning, str):
            rendered["reasoning"] = rendered["reasoning_content"] = reasoning
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                rendered[key] = message[key]
        out.append(rendered)
    return out


def vllm_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """The tools as vLLM passes them to the template: `ChatCompletionToolsParam.model_dump()`,
    so a function's missing description or parameters render as null and unknown keys go."""
    if not tools:
        return None
    out = []
    for tool in tools:
        function = tool.get("function") or {}
        dumped = {
            "name": function.get("name"),
            "description": function.get("description"),
            "parameters": function.get("parameters"),
        }
        if function.get("strict") is not None:
            dumped["strict"] = function["strict"]
        # a tool-level defer_loading is copied into the function, and kept where it was
        defer = function.get("defer_loading", tool.get("defer_loading"))
        if defer is not None:
            dumped["defer_loading"] = defer
        tool_dump: dict[str, Any] = {"type": "function", "function": dumped}
        if tool.get("defer_loading") is not None:
            tool_dump["defer_loading"] = tool["defer_loading"]
        out.append(tool_dump)
    return out
