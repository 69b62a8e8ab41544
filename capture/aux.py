"""Which calls are auxiliary (not the agent working), decided at export when the session is whole.

An auxiliary call is real engine work the agent did not act on as a step of the task: opencode's
title generator (its first call: no tools, "You are a title generator"), Claude Code's quota probe
(`max_tokens: 1`, "quota") and topic/title checks, a summariser that compacts history. Training on
them with the rollout's reward credits the title for solving the task, so they are kept in the
trace for accounting but with an all-zero loss mask and `aux_reason` saying why.

The rule is structural first, text second, in this order:

    count_probe              the agent capped the call at <= 1 output token: a probe, not a turn
    title_generator          a call without tools whose system prompt / last message asks for a title
    summarizer               a call without tools that asks to summarise or compact; or a call
                             WITH tools whose last user message asks for a summary and forbids
                             tools (Claude Code 2.1 sends its compaction request with its whole
                             tool manifest, for the prompt cache, and "CRITICAL: Respond with TEXT
                             ONLY. Do NOT call any tools. ... a <summary> block":
                             tests/test_compaction_agents.py), and that the agent then treated
                             as a compaction: no later call continued it, and a later call
                             started a new history
    no_tools_in_tool_session the session sends tools on some calls and this one has none

Why structure decides and text only names: coding agents always send their tool manifest on a real
step (opencode 10 tools, Claude Code 24, Codex its shell tools, mini-swe-agent one `bash`), while
their side calls send none. Text matching alone needed a new entry per agent and failed silently on
agents nobody profiled (OpenEnv's lesson); it is used here only for calls that already have no
tools, to name the reason. A session that never sends tools (an agent that parses tool calls out of
text) has no structural signal, so only probes and explicit title/summary calls are tagged there.

The one text rule on a call with tools (summarizer) needs both a summary word and a no-tools
order in the last user message, and only after an earlier call with tools (a compaction follows
work; the task arrives on the first call): a task that says "summarise" stays the agent's turn.

Text the policy controls must not decide what trains: a command's output reaches the next call
(a tool message, or a user message where an agent sends observations or format errors as user
text: mini-swe-agent does both), and so does a task's own wording, which stays the last user
message of every later call of an agent that sends observations as tool messages. So a text
rule that would leave a call untrained also needs what only the agent does (the `continued` and
`history_restarts_later` flags, from the capture graph: capture.export): a compaction's reply is
never extended by the agent's next call, and the next call starts a new history. A turn the
agent went on from is its turn and trains, whatever its last user message says. In a session
that never sends tools the same holds for a summary there, and a title call is named by its
system prompt only (the policy cannot write that).

No user hook is needed for opencode, Claude Code, Codex or mini-swe-agent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["aux_hint", "classify"]

_TITLE_WORDS = ("title",)
_SUMMARY_WORDS = ("summar", "compact")
# A compaction request that still sends the tools says not to use them (Claude Code 2.1)
_NO_TOOLS_ORDERS = ("do not call any tools", "respond with text only")
HINT_CHARS = 400


def aux_hint(messages: list[Any]) -> str:
    """A short lowercase excerpt (system prompt head + last user text) kept per call for export."""
    # Only the ends of the list are read (the system prompt leads, the newest user turn trails:
    # a title or summary request is the last message), so the cost does not grow with the history.
    system = ""
    for message in messages[:4]:
        if isinstance(message, dict) and message.get("role") == "system":
            system = _text(message.get("content"))[:HINT_CHARS]
            break
    last_user: Any = ""
    for message in reversed(messages[-8:]):
        if isinstance(message, dict) and message.get("role") == "user":
            last_user = message.get("content")
            break
    return f"{system}\n{_LAST_USER}{_text(last_user)[:HINT_CHARS]}".lower()


_LAST_USER = "\x00last user: "  # separates the two parts of a hint (no prompt holds a NUL)


def _compaction_with_tools(hint: str) -> bool:
    """A summary request whose last user message forbids the tools it was sent with."""
    _, _, last_user = hint.rpartition(_LAST_USER)
    return any(order in last_user for order in _NO_TOOLS_ORDERS) and \
        any(word in last_user for word in _SUMMARY_WORDS)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "") for part in content if isinstance(part, dict)
            and isinstance(part.get("text"), str)
        )
    return ""


def _agent_compacted(info: dict[str, Any]) -> bool:
    """The agent treated this call as a compaction: it never continued from the reply, and a
    later call started a new history (capture.export sets both flags from the graph)."""
    return not info.get("continued", True) and bool(info.get("history_restarts_later"))


def classify(calls: Iterable[dict[str, Any]]) -> list[str | None]:
    """One aux reason (or None) per call info dict, in order. Looks at the whole session at once.

    A dict holds the call's `n_tools`, `max_tokens_requested`, `hint` (aux_hint) and, from the
    capture graph, `continued` (a later retained call extends it) and `history_restarts_later`
    (a later retained call is a root); without them no text rule leaves a call untrained."""
    infos = list(calls)
    session_uses_tools = any(info.get("n_tools", 0) > 0 for info in infos)
    reasons: list[str | None] = []
    worked = False  # an earlier call of this session sent tools
    for info in infos:
        cap = info.get("max_tokens_requested")
        if isinstance(cap, int) and cap <= 1:
            reasons.append("count_probe")
            continue
        hint = info.get("hint", "")
        if info.get("n_tools", 0) > 0:
            compaction = worked and _compaction_with_tools(hint) and _agent_compacted(info)
            reasons.append("summarizer" if compaction else None)
            worked = True
            continue
        if session_uses_tools:
            # aux by structure (no tools in a tool session); the text only names why
            reasons.append("title_generator" if any(w in hint for w in _TITLE_WORDS)
                           else "summarizer" if any(w in hint for w in _SUMMARY_WORDS)
                           else "no_tools_in_tool_session")
            continue
        system, _, _ = hint.partition(_LAST_USER)
        if any(word in system for word in _TITLE_WORDS):
            reasons.append("title_generator")
        elif any(word in hint for word in _SUMMARY_WORDS) and _agent_compacted(info):
            reasons.append("summarizer")
        else:
            reasons.append(None)
    return reasons
