"""The dialect contract: how an agent's wire format meets the engine's chat API.

The capture proxy always talks to the engine in one language, vLLM's OpenAI Chat Completions
API. Each agent speaks its own: opencode and mini-swe-agent speak Chat Completions, Codex speaks
the Responses API, Claude Code speaks Anthropic Messages. A dialect is the pair of translators
between one agent format and the engine's chat format:

    agent request body --to_chat--> chat request --(core forwards)--> engine
    engine chat reply  --from_chat / StreamEncoder--> agent reply body / SSE bytes

The one decision: a dialect is a pure function of the bodies it is given. It does no I/O, keeps
no state across calls (the optional per-session `TranslationMemo` it may be handed only saves
re-translating a resent history; the result is the same without it), and knows nothing about
sessions, sampling policy or token ids; the core
(capture/server and friends) forwards, enforces sampling, and reads token ids and logprobs from
the engine reply itself. A dialect never sees the training record and never decides what is
trainable.

What a dialect must preserve, in both directions: system prompts, tool definitions, tool calls
(ids kept as they are, so a call and its result stay paired across turns), tool results,
reasoning/thinking text, and several tool calls in one turn. The history an agent sends back is
turned into the same chat messages the engine's reply was made from, so that the engine renders
the same prompt tokens again and the rollout graph can chain the turns by token prefix.

What it refuses to do: guess. Input it cannot translate faithfully (a wrong type, a missing
field, a stateful feature such as `previous_response_id`) raises `DialectError`, which the core
answers with a 4xx in the agent's own error shape. Any other exception from a dialect is a bug.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .memo import TranslationMemo

try:  # optional: the stdlib encoder is the always-present fallback
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

__all__ = [
    "ENGINE_REASONING_FIELD",
    "Dialect",
    "DialectError",
    "StreamEncoder",
    "StreamTokens",
    "arguments_json",
    "as_dict",
    "as_int",
    "copy_sampling",
    "dumps",
    "dumps_bytes",
    "first_choice",
    "first_delta",
    "optional_int",
    "order_tool_results",
    "parse_arguments",
    "reasoning_text",
    "require",
    "require_body",
    "sse_data",
    "sse_event",
    "tool_calls_of",
    "type_name",
    "usage_counts",
]


class DialectError(Exception):
    """The agent sent something this dialect cannot translate; the core answers 4xx.

    `message` says what was wrong and where (a JSON path such as `messages[2].content`), so
    the agent's log tells its author what to fix.
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StreamEncoder(ABC):
    """Turns one engine chat stream into the agent's SSE stream, chunk by chunk.

    One encoder per streaming call. `on_chunk` gets each parsed `chat.completion.chunk` in
    order (the core must not mutate a chunk after handing it over, and the encoder never mutates
    it either); `finish` runs once after the engine's `[DONE]`; `fail` replaces `finish` when the
    call dies mid-stream. Each returns the bytes to write to the agent (possibly b"").
    """

    @abstractmethod
    def on_chunk(self, chunk: dict) -> bytes:
        """One engine chunk -> SSE bytes for the agent."""

    @abstractmethod
    def finish(self) -> bytes:
        """The engine sent [DONE]: close open blocks/items and end the stream."""

    @abstractmethod
    def fail(self, message: str) -> bytes:
        """The call failed mid-stream: an error event in the dialect's format, then the end."""

    def set_prompt_tokens(self, n: int) -> None:  # noqa: B027 - optional hook, most ignore it
        """The engine's prompt length, told before the first chunk when the core cut the prompt
        ids out of it (a dialect that reports it up front, like Anthropic's message_start)."""


class Dialect(ABC):
    """Translators for one agent wire format. Stateless; one shared instance per dialect."""

    name: str

    @abstractmethod
    def to_chat(self, body: dict, memo: TranslationMemo | None = None) -> dict:
        """Agent request body -> engine chat request body. Raises DialectError on bad input.

        `memo` (the session's, see dialects.memo) lets a resent history skip re-translation.
        """

    @abstractmethod
    def from_chat(self, chat: dict, request: dict) -> dict:
        """Non-streaming engine chat reply -> agent reply body. `request` is the agent's body."""

    @abstractmethod
    def stream_encoder(self, request: dict) -> StreamEncoder:
        """A fresh encoder for one streaming call. `request` is the agent's body."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict:
        """A non-streaming error body in the dialect's own shape."""

    def message_translator(self) -> Callable[[int, Any], list[Any]] | None:
        """`translate(index, message)` -> the engine chat messages it becomes, when `to_chat`
        translates the agent's growing list item by item into the engine's `messages` and nothing
        else about a resent request changes (`capture.early` sends such a call ahead); else None."""
        return None

    def count_tokens(self, body: dict) -> dict | None:
        """Answer for a token-count side route, or None when the dialect has none."""
        return None


# --- shared helpers ---------------------------------------------------------------------------


# One encoder for the process: `json.dumps` with non-default options builds a new encoder on
# every call, a measurable share of the per-chunk cost on the streaming hot path.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def dumps(obj: Any) -> str:
    """Compact JSON as providers send it (non-ASCII kept, no spaces)."""
    return _ENCODER.encode(obj)


def dumps_bytes(obj: Any) -> bytes:
    """`dumps` as UTF-8 bytes; orjson when present (~10x faster on small event dicts).

    Falls back to the stdlib for what orjson refuses (a lone surrogate or an integer beyond
    64 bits echoed from a hostile request); "replace" keeps such a stream alive.
    """
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return _ENCODER.encode(obj).encode("utf-8", "replace")


def sse_event(event: str, data: dict) -> bytes:
    """A named SSE event (Anthropic Messages, OpenAI Responses)."""
    return b"event: " + event.encode() + b"\ndata: " + dumps_bytes(data) + b"\n\n"


def sse_data(data: dict | str) -> bytes:
    """A bare `data:` SSE line (Chat Completions)."""
    payload = data.encode() if isinstance(data, str) else dumps_bytes(data)
    return b"data: " + payload + b"\n\n"


# The assistant-message field that carries earlier reasoning back to the engine. vLLM 0.32 renders
# `reasoning` (its chat parser hands the template both `reasoning` and `reasoning_content`, from
# `reasoning`) and calls `reasoning_content` deprecated: its chat-completions request renames a
# `reasoning_content` to `reasoning` only when `reasoning` is absent. Every dialect writes this one
# name, so the request the proxy forwards (and records) says what the engine renders, and the
# scripted engine (harness/audit/vllm_chat.py) renders the same history as vLLM.
ENGINE_REASONING_FIELD = "reasoning"


def reasoning_text(message: dict) -> str | None:
    """Reasoning text of an engine message or delta.

    vLLM 0.32 names it `reasoning`; older servers and other engines `reasoning_content`.
    """
    value = message.get("reasoning")
    if value is None:
        value = message.get("reasoning_content")
    return value if isinstance(value, str) else None


def type_name(value: Any) -> str:
    """JSON type name of a Python value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def require(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """`value` if it has JSON type `kind`, else DialectError naming the path."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python, never in JSON.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        expected = " or ".join(_KIND_NAMES.get(k, k.__name__) for k in kinds)
        raise DialectError(f"{where} must be {expected}, got {type_name(value)}")
    return value


def require_body(body: Any) -> dict:
    """The request body as a JSON object, or DialectError."""
    return require(body, dict, "request body")


_KIND_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
}


def optional_int(body: dict, key: str, where: str | None = None) -> int | None:
    """An optional positive-or-zero integer field."""
    value = body.get(key)
    if value is None:
        return None
    require(value, int, where or key)
    if value < 0:
        raise DialectError(f"{where or key} must be >= 0, got {value}")
    return value


def copy_sampling(body: dict, out: dict, keys: tuple[str, ...]) -> None:
    """Copy numeric sampling fields the agent sent; the core's policy overrides them later."""
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        require(value, (int, float), key)
        out[key] = value


def as_dict(value: Any) -> dict:
    """`value` if it is an object, else {} (engine data is read defensively)."""
    return value if isinstance(value, dict) else {}


def as_int(value: Any) -> int:
    """`value` as a count if it is a finite number, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return 0
    return int(value) if abs(value) < 2**63 else 0


def usage_counts(usage: Any) -> tuple[int, int, int]:
    """(prompt, completion, cached prompt) tokens of an engine usage object; 0 where missing."""
    usage = as_dict(usage)
    cached = as_dict(usage.get("prompt_tokens_details")).get("cached_tokens")
    return as_int(usage.get("prompt_tokens")), as_int(usage.get("completion_tokens")), \
        as_int(cached)


def parse_arguments(arguments: Any) -> Any:
    """Tool-call arguments (a JSON string from the engine) as a value; None if not JSON."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str):
        return None
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return None


def arguments_json(value: Any) -> str:
    """Tool input as the engine's tool parser writes it: `json.dumps(args, ensure_ascii=False)`.

    vLLM's hermes parser re-serialises the arguments it parsed with default separators, so the
    same call sent back in history (Anthropic `input`, a Responses custom tool's `input`)
    becomes the same string the engine produced.
    """
    return json.dumps(value, ensure_ascii=False)


def first_choice(chat: dict) -> dict:
    """The one choice the capture proxy asks for (n=1)."""
    choices = chat.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}


def first_delta(chunk: dict) -> tuple[dict, dict] | None:
    """(choice, delta) of a stream chunk, or None for a chunk without a choice."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    return choices[0], as_dict(choices[0].get("delta"))


class StreamTokens:
    """A stream's token counts for its final usage, as the stream encoders report them: the
    engine's usage chunk once one came (it then wins), else one per sampled token id (and the
    prompt ids' length, which each encoder takes from the chunk that carries them)."""

    __slots__ = ("cached", "completion", "prompt", "usage_seen")

    def __init__(self) -> None:
        self.prompt = 0
        self.completion = 0
        self.cached = 0
        self.usage_seen = False

    def take(self, chunk: dict) -> tuple[dict, dict] | None:
        """Count what `chunk` says; its (choice, delta) as `first_delta` gives them."""
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage_seen = True
            self.prompt, self.completion, self.cached = usage_counts(usage)
        picked = first_delta(chunk)
        if picked is not None:
            token_ids = picked[0].get("token_ids")
            if isinstance(token_ids, list) and not self.usage_seen:
                self.completion += len(token_ids)
        return picked


def tool_calls_of(message: dict) -> list[dict]:
    """The engine message's tool calls, as a list of well-formed dicts."""
    calls = message.get("tool_calls") or []
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


def order_tool_results(messages: list[dict]) -> list[dict]:
    """Put each run of `tool` messages in the order of the calls they answer.

    Chat templates of the hermes family render tool results as bare `<tool_response>` blocks
    with no call id, so the model can only pair results with calls by position. Claude Code
    2.1 was measured sending two results in reverse call order; left as sent, the model would
    read "there" as the output of `echo hi`. Results whose id matches no call keep their place
    after the matched ones.
    """
    out: list[dict] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        out.append(message)
        i += 1
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if not calls:
            continue
        run_end = i
        while run_end < len(messages) and messages[run_end].get("role") == "tool":
            run_end += 1
        if run_end - i > 1:
            rank = {c.get("id"): k for k, c in enumerate(calls) if isinstance(c, dict)}
            run = messages[i:run_end]
            out.extend(sorted(run, key=lambda m: rank.get(m.get("tool_call_id"), len(rank))))
            i = run_end
    return out
