"""Which calls belong to the agent's own conversation, decided at export when the session is whole.

Why: the agent's session key is readable inside the sandbox, so the policy being trained can make
model calls of its own (`curl` with the key, prompts of its choosing). Trained with the rollout's
reward, such calls let the policy pick its own training prompts. The rollout caps
(capture.caps) bound how many; this module marks them, so the trainer can leave them out
(`train_unplaced_calls`, off by default) and every run counts them.

A retained, non-aux call is *placed* when the rollout graph can put it in the agent's own
conversation:

    the main root           the first non-aux call of the session (the agent's first turn)
    extends                 its parent (exact token prefix, capture.graph) is placed
    rewritten history       a root whose first user message is the main root's (the task as the
                            agent was given it): a template that drops old reasoning, a swapped
                            system prompt (Claude Code at call ~6), a re-rendered history
    compaction              a root whose messages carry the reply of one of the session's
                            summarizer calls (capture.aux): the history after a compaction. A
                            reply with a `<summary>` block counts by that block: Claude Code asks
                            for `<analysis>...</analysis><summary>...</summary>`, re-asks once
                            when the block is missing, and goes on with the block's text only

Anything else is `unplaced` (trace metadata `unplaced: true`, counted in the stats as
`unplaced`). Aux calls are never unplaced: they are already untrained (capture.aux).

How each retained call joined the rollout (`join_kinds`; the stats' `joins`, each turn's metadata
`join`), so a run says whether its rows chain or fragment:

    extended   the first child of its parent: the agent's next turn on the same tokens
    branched   a later child of a parent that already had one: a retry, a rewind, or a history
               whose re-render of an earlier reply differs from what was sampled, so the call
               hangs off the last call whose completion did come back token for token (opencode's
               calls 4-10 under turn 2: text before a tool call never round-trips through vLLM's
               hermes parser and a Qwen-style template; tests/test_capture_joins.py)
    rewritten  a placed root that is not the main one: a rewritten history (a template that drops
               earlier reasoning across a user turn, a swapped system prompt, a compaction)
    new_root   the main root, an aux call's root (title, summary), or an unplaced root

What this does not promise: a policy that copies the task's instruction verbatim into its own call
makes a "rewritten history" that is placed; such calls are still bounded by the rollout caps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .graph import Node

__all__ = ["JOINS", "join_counts", "join_kinds", "summary_body", "unplaced_nodes"]

_MIN_SUMMARY_CHARS = 40  # a summary shorter than this is no evidence of a compaction


def unplaced_nodes(turns: Sequence[tuple[Node, str | None]]) -> set[str]:
    """The node ids of the retained turns (node, aux reason) that are unplaced (module doc)."""
    placed: set[str] = set()
    unplaced: set[str] = set()
    task_text: str | None = None
    summaries: list[str] = []
    for node, aux_reason in turns:
        if aux_reason is not None:
            placed.add(node.node_id)  # untrained anyway; its descendants are judged on their own
            if aux_reason == "summarizer":
                text = summary_body(_reply_text(node))
                if len(text) >= _MIN_SUMMARY_CHARS:
                    summaries.append(text)
            continue
        parent = node.parent
        if parent is not None and parent.node_id in placed and parent.node_id not in unplaced:
            placed.add(node.node_id)
            continue
        if parent is not None and parent.node_id in unplaced:
            unplaced.add(node.node_id)
            continue
        messages = _root_messages(node)
        first = _first_user_text(messages)
        if task_text is None and parent is None:
            task_text = first  # the main root
            placed.add(node.node_id)
        elif (first is not None and first == task_text) or (
                summaries and _carries_summary(messages, summaries)):
            placed.add(node.node_id)
        else:
            unplaced.add(node.node_id)
    return unplaced


def summary_body(reply: str) -> str:
    """The part of a summarizer's reply an agent carries on: its `<summary>` block if it has
    one (Claude Code drops the `<analysis>` before it), else the whole reply."""
    start = reply.find("<summary>")
    if start < 0:
        return reply.strip()
    end = reply.find("</summary>", start)
    return reply[start + len("<summary>"):end if end >= 0 else None].strip()


def _root_messages(node: Node) -> list[Any]:
    """The whole chat-form request of a call (for a root, its new messages are all of them)."""
    if node.messages is not None:
        return node.messages
    path = node.path()
    messages: list[Any] = []
    for step in path:
        request = step.info.get("request") or {}
        messages.extend(request.get("new_messages") or [])
    return messages


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _first_user_text(messages: list[Any]) -> str | None:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            return _text(message.get("content"))
    return None


def _reply_text(node: Node) -> str:
    response = node.info.get("response") or {}
    choices = response.get("choices") if isinstance(response, dict) else None
    message = (choices[0] or {}).get("message") if isinstance(choices, list) and choices else (
        response.get("message") if isinstance(response, dict) else None)
    return _text(message.get("content")) if isinstance(message, dict) else ""


def _carries_summary(messages: list[Any], summaries: list[str]) -> bool:
    texts = [_text(m.get("content")) for m in messages if isinstance(m, dict)]
    return any(summary[:_MIN_SUMMARY_CHARS * 4] in text for summary in summaries
               for text in texts)


JOINS = ("extended", "branched", "rewritten", "new_root")


def join_kinds(turns: Sequence[tuple[Node, str | None]], unplaced: set[str]) -> dict[str, str]:
    """node_id -> how it joined the rollout (one of JOINS; module doc), for the retained turns."""
    kinds: dict[str, str] = {}
    retained = {node.node_id for node, _ in turns}
    main_root: str | None = None
    for node, aux_reason in turns:
        parent = node.parent
        if parent is not None:
            # first among the retained: a retry nobody continued (dropped) does not make the
            # one the agent went on with a branch
            first = next(c for c in parent.children if c.node_id in retained) is node
            kinds[node.node_id] = "extended" if first else "branched"
        elif aux_reason is None and main_root is None:
            main_root = node.node_id
            kinds[node.node_id] = "new_root"
        elif aux_reason is None and node.node_id not in unplaced:
            kinds[node.node_id] = "rewritten"
        else:
            kinds[node.node_id] = "new_root"
    return kinds


def join_counts(kinds: dict[str, str]) -> dict[str, int]:
    """How many calls joined each way (every kind present, 0 when none)."""
    counts = dict.fromkeys(JOINS, 0)
    for kind in kinds.values():
        counts[kind] += 1
    return counts
