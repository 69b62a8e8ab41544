"""OpenAI Responses API: what Codex CLI speaks, translated to and from the engine's chat API.

Wire facts
- Route: `POST {base}/responses` (base = `.../s/{session}/v1`). Codex 0.171 speaks nothing else
  (`wire_api = "responses"` in its `model_providers` entry), always streaming, with
  `store: false`, `include: ["reasoning.encrypted_content"]`, `reasoning: {"summary": "auto"}`,
  `tool_choice: "auto"`, `parallel_tool_calls: true`, an empty `instructions` and its system
  prompt as `developer` input messages. Codex marks its own aux calls with the
  `x-codex-turn-metadata` header (`request_kind`); the dialect does not read headers.
- Request items: `message` (input_text / output_text / input_image parts), `reasoning`
  (summary, content, encrypted_content), `function_call`, `function_call_output`,
  `custom_tool_call(_output)`, `local_shell_call(_output)`. See `responses_request`.
- Reply: a `response` object whose `output` lists, in order, an optional `reasoning` item, an
  optional assistant `message` item (one `output_text` part) and one item per tool call
  (`function_call`, `custom_tool_call` or `local_shell_call`).
- SSE (named events, each with a rising `sequence_number`), see `responses_stream`:
  response.created, response.in_progress, then per item response.output_item.added ...
  response.output_item.done, and finally response.completed (response.incomplete only when
  the agent's own `max_output_tokens` was reached: Codex aborts its run on it, so a stop at
  the proxy's cap is reported completed, see `responses_items.status_of`). Errors: `error`
  then `response.failed`.

IDs: the response id is `resp_` + the engine completion id; item ids derive from it, and a tool
call's `call_id` is the engine's tool call id unchanged, so results pair with calls across turns.
Reasoning text travels back in `encrypted_content` (base64 with an `hxr1:` mark, not a secret)
so the next turn's history carries the exact reasoning the engine produced.
"""

from __future__ import annotations

import time

from .base import (
    Dialect,
    as_dict,
    as_int,
    first_choice,
    reasoning_text,
    tool_calls_of,
    usage_counts,
)
from .chat import openai_error
from .memo import TranslationMemo
from .responses_items import (
    ids_from,
    message_item,
    reasoning_item,
    response_object,
    response_usage,
    status_of,
    tool_call_item,
)
from .responses_request import responses_to_chat, tool_routes
from .responses_stream import ResponsesStreamEncoder

__all__ = ["ResponsesDialect"]


class ResponsesDialect(Dialect):
    """Responses in, chat to the engine, Responses out."""

    name = "responses"

    def to_chat(self, body: dict, memo: TranslationMemo | None = None) -> dict:
        return responses_to_chat(body, memo)

    def from_chat(self, chat: dict, request: dict) -> dict:
        suffix = ids_from(chat.get("id"))
        choice = first_choice(chat)
        message = as_dict(choice.get("message"))
        output: list[dict] = []
        reasoning = reasoning_text(message)
        if reasoning:
            output.append(reasoning_item(f"rs_{suffix}_{len(output)}", reasoning))
        content = message.get("content")
        if isinstance(content, str) and content:
            output.append(message_item(f"msg_{suffix}_{len(output)}", content))
        routes = tool_routes(request) if message.get("tool_calls") else {}
        for i, call in enumerate(tool_calls_of(message)):
            function = as_dict(call.get("function"))
            name = str(function.get("name") or "")
            call_id = str(call.get("id") or f"call_{suffix}_{i}")
            output.append(tool_call_item(routes.get(name), f"fc_{suffix}_{i}", call_id, name,
                                         str(function.get("arguments") or "")))
        finish = choice.get("finish_reason")
        prompt, completion, cached = usage_counts(chat.get("usage"))
        return response_object(
            request, f"resp_{suffix}", as_int(chat.get("created")) or int(time.time()),
            status_of(finish, request, completion), output,
            response_usage(prompt, completion, cached), finish,
        )

    def stream_encoder(self, request: dict) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(request)

    def error_body(self, status: int, message: str) -> dict:
        return openai_error(status, message)
