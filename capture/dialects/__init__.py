"""Agent API dialects of the capture proxy: each agent's wire format <-> the engine's chat API.

`DIALECTS` maps the dialect name the core routes by to its shared, stateless instance:

    "chat"       OpenAI Chat Completions   opencode (streaming), mini-swe-agent (non-streaming)
    "responses"  OpenAI Responses          Codex CLI (streaming)
    "messages"   Anthropic Messages        Claude Code (streaming; + count_tokens)

The contract (pure functions, DialectError for bad input, one StreamEncoder per stream) is in
`base`; each dialect module opens with its wire facts.
"""

from __future__ import annotations

from .base import Dialect, DialectError, StreamEncoder
from .chat import ChatDialect
from .messages import MessagesDialect
from .responses import ResponsesDialect

__all__ = ["DIALECTS", "ChatDialect", "Dialect", "DialectError", "MessagesDialect",
           "ResponsesDialect", "StreamEncoder"]

DIALECTS: dict[str, Dialect] = {
    "chat": ChatDialect(),
    "responses": ResponsesDialect(),
    "messages": MessagesDialect(),
}
