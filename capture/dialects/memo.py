"""Translate only what is new: a session's memo of its last requests' per-item translations.

A coding agent resends its whole history on every call, so a dialect that translates every
message on every call does work that grows with the conversation: measured on a 150-turn chat
session (300 messages, 41k ids) `_normalise_messages` alone was the largest Python cost of the
proxy and the reason its added latency grew from 3.7 ms to 11 ms per call.

The memo keeps, for the last few requests of one session, the source items (the parsed JSON the
agent sent) and what each translated to. A new request reuses the translations of the longest
prefix of items that are *equal* to a remembered request's (dict/list equality, compared in C),
and translates only the items after it. So the Python-level work per call is O(new items); the
history is touched only by C-level compares, as the rollout graph does with token ids.

Why equality and not identity or hashes: every request is parsed afresh, so nothing is identical;
equality has no collisions and costs a memcmp per string. Its one looseness is Python's: JSON `1`,
`1.0` and `true` compare equal, so a resent message that changed only that spelling of a value
would get the earlier spelling. Text (contents, tool-call arguments, ids) is compared exactly.

Constraints on the translators it runs: an item's translation may depend only on the item itself
(never on its neighbours), and neither the memo's users nor anything downstream may mutate a
translated item in place (they are shared by the requests that reuse them). A rewritten history
(compaction, a swapped system prompt) simply matches a shorter prefix and is translated again.

Several remembered requests, not one, because one session interleaves conversations: opencode's
title call, Claude Code's subagents and probes, each would otherwise evict the main thread's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

__all__ = ["TranslationMemo", "common_prefix", "translate_items"]

# Conversations remembered per kind of item (main thread, subagents, side calls).
KEEP = 4


class TranslationMemo:
    """Per-session memory of recent translations; owned by the session, used by dialects."""

    __slots__ = ("_runs", "_values", "hits", "misses")

    def __init__(self) -> None:
        # kind -> most recent first: (source items, per-item translations)
        self._runs: dict[str, list[tuple[list[Any], list[list[Any]]]]] = {}
        # kind -> (source value, translation) for whole values such as a tool manifest
        self._values: dict[str, tuple[Any, Any]] = {}
        self.hits = 0  # items reused
        self.misses = 0  # items translated

    def items(self, kind: str, items: list[Any],
              translate: Callable[[int, Any], list[Any]]) -> list[Any]:
        """`translate(i, item)` for each item, reusing a remembered equal prefix; flattened."""
        runs = self._runs.setdefault(kind, [])
        best, reused = -1, 0
        for n, (source, _) in enumerate(runs):
            k = common_prefix(source, items)
            if k > reused:
                best, reused = n, k
        done = runs[best][1][:reused] if best >= 0 else []
        fresh = [translate(i, items[i]) for i in range(reused, len(items))]
        per_item = done + fresh
        self.hits += reused
        self.misses += len(fresh)
        if best >= 0 and reused == len(runs[best][0]):
            runs.pop(best)  # the same conversation, one call further: replace it
        runs.insert(0, (items, per_item))
        del runs[KEEP:]
        return list(chain.from_iterable(per_item))

    def value(self, kind: str, source: Any, translate: Callable[[Any], Any]) -> Any:
        """`translate(source)`, reused while the agent sends an equal `source` again."""
        remembered = self._values.get(kind)
        if remembered is not None and remembered[0] == source:
            return remembered[1]
        result = translate(source)
        self._values[kind] = (source, result)
        return result


_CHUNK = 1 << 16


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items (or bytes) of `a` and `b` are equal. The common case, one a prefix
    of the other, is one C compare; otherwise chunked compares, then bisection to the first
    difference. For lists of messages (here) and for request bytes (capture.resent)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo = 0
    while lo + _CHUNK <= n and a[lo:lo + _CHUNK] == b[lo:lo + _CHUNK]:
        lo += _CHUNK
    hi = min(lo + _CHUNK, n)
    while lo < hi:  # invariant: a[:lo] == b[:lo], and a[:hi + 1] != b[:hi + 1] unless hi == n
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def translate_items(memo: TranslationMemo | None, kind: str, items: list[Any],
                    translate: Callable[[int, Any], list[Any]]) -> list[Any]:
    """Translate a list item by item, through the memo when the caller has one."""
    if memo is None:
        return list(chain.from_iterable(translate(i, item) for i, item in enumerate(items)))
    return memo.items(kind, items, translate)
