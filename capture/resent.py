"""Read an agent's resent request, and write the engine's, in time that grows with what is new.

A coding agent sends its whole conversation on every call: the last request's bytes with a few
messages appended. The translation memo (`dialects/memo.py`) and the token-text compare
(`tokens.py`) made the proxy's Python work O(new), but it still parsed the agent's whole JSON and
serialised the engine's whole body on every call. At 41k ids (a 190 KB body) those two were the
proxy's largest costs and grew with the history: measured in the live proxy, the parse took
0.5-1.6 ms (its objects are cold in cache by the next call) and the serialisation 0.1-0.4 ms.

`RequestReader` parses only the appended bytes. Once it has seen a conversation grow by an append
(and checked that with a full parse, below), it knows the offset of the `]` that closes the
growing list (`messages`, or `input` for the Responses API). A later request that is byte for
byte the earlier one with `,<items>` inserted before that `]` (and before any whitespace an
indenting serialiser put ahead of it) is the earlier request with those items appended: only
`[<items>]` is parsed and the earlier values are reused, the same objects, so the translation
memo's compare of the resent prefix is a pointer compare too. What is checked, all
in C: the bytes before the `]` are equal (one memcmp), the bytes from it to the end are equal, and
the inserted bytes parse on their own as one or more JSON values. If the inserted bytes held a `]`
that closed the list early and opened another, `[<items>]` would not parse; so a body the fast
path accepts is exactly what `orjson.loads` would return for it (tests/test_capture_resent.py
checks it against the full parse on random and hostile sequences). Anything else (an edited
message, Claude Code moving its cache breakpoint, a new field) is parsed in full. A request equal
to a remembered one (an SDK retrying a call) is not parsed at all.

Which list grew, and where it ends, is learnt, never guessed from key names: after a full parse,
if the request is the last one with `,<items>` inserted at the first differing byte, which held
a `]`, and the full parse equals the earlier body with those items appended to one top-level list
and nothing else changed, that list's end is known from then on. That check compares the whole
history once per conversation, not once per call.

`EngineBodies` does the same on the way out: the engine body is written with `messages` last, so a
chat body that is the last one with messages appended (the same objects, checked by identity, and
every other field serialising to the same bytes) is the last bytes with the new messages spliced
in before the closing `]}`. The call's engine `seed` (capture.sampling: a new one every call) is
written first, `{"seed":N,...`, and left out of the comparison, so a new seed does not stop the
splice: the next body takes the last one's bytes after its seed (`seed_lead`, `lead_length`).

Several conversations are remembered per session (a title call, a subagent, a probe interleave with
the main thread); each costs its last request's bytes.
"""

from __future__ import annotations

import operator
from typing import Any

from .dialects.memo import common_prefix
from .upstream import JSON_ERRORS, dumps, loads

__all__ = ["EngineBodies", "RequestReader", "inserted_items", "lead_length", "seed_lead"]

# Conversations remembered per session, most recent first.
KEEP = 3
# Whitespace an indenting serialiser puts between a list's last item and its `]`.
_WHITE_MAX = 64


class _Seen:
    """One remembered request: its bytes, its body, and (once learnt) the list that grows."""

    __slots__ = ("body", "end", "key", "raw")

    def __init__(self, raw: bytes, body: dict[str, Any], key: str | None, end: int) -> None:
        self.raw, self.body, self.key, self.end = raw, body, key, end


class RequestReader:
    """Per-session parser of agent request bodies; `read(raw)` returns what `loads(raw)` would."""

    __slots__ = ("_seen", "appended", "parsed", "repeated")

    def __init__(self) -> None:
        self._seen: list[_Seen] = []
        self.appended = 0  # requests read by parsing only their appended items
        self.repeated = 0  # requests equal to a remembered one (a retry): nothing parsed
        self.parsed = 0  # requests parsed in full

    def read(self, raw: bytes) -> Any:
        """The parsed body (a fresh top-level dict and list; the items may be shared with earlier
        requests, so nothing downstream may mutate them). Raises what `loads` raises."""
        for index, seen in enumerate(self._seen):
            if len(raw) == len(seen.raw) and raw == seen.raw:  # the same call sent again
                self.repeated += 1
                self._remember(index, seen)
                return _fresh(seen.body, seen.key)
            if seen.end >= 0:
                body = _appended(seen, raw)
                if body is not None:
                    self.appended += 1
                    end = len(raw) - (len(seen.raw) - seen.end)
                    self._remember(index, _Seen(raw, body, seen.key, end))
                    return _fresh(body, seen.key)
        body = loads(raw)
        if not isinstance(body, dict):
            return body
        self.parsed += 1
        for index, seen in enumerate(self._seen):
            learnt = _learn(seen, raw, body)
            if learnt is not None:
                self._remember(index, _Seen(raw, body, *learnt))
                return _fresh(body, learnt[0])
        self._remember(None, _Seen(raw, body, None, -1))
        return _fresh(body, None)

    def growing(self, raw: bytes) -> tuple[str, int, int] | None:
        """For the request just read (`raw`): (the key of its growing list, where items would be
        inserted in `raw`, how many items it holds), once learnt; else None."""
        seen = self._seen[0] if self._seen else None
        if seen is None or seen.raw is not raw or seen.key is None or seen.end < 0:
            return None
        return seen.key, seen.end, len(seen.body[seen.key])

    def _remember(self, replaces: int | None, seen: _Seen) -> None:
        if replaces is not None:
            self._seen.pop(replaces)  # the same conversation, one call further
        self._seen.insert(0, seen)
        del self._seen[KEEP:]


def _fresh(body: dict[str, Any], key: str | None) -> dict[str, Any]:
    out = dict(body)
    if key is not None:
        out[key] = list(out[key])
    return out


def inserted_items(old: bytes, end: int, raw: bytes) -> list[Any] | None:
    """The items `raw` inserts into `old` at `end` (as `,<items>`), parsed; None if `raw` is not
    `old` with items inserted there. `end` must be where a list's items end in `old` (learnt)."""
    cut = len(raw) - (len(old) - end)  # where the `]` would be in `raw`
    # A memoryview prefix: startswith compares in place, no copy of the history's bytes.
    if cut <= end + 1 or raw[end] != 44 or not raw.startswith(memoryview(old)[:end]):  # 44: ","
        return None
    if not raw.endswith(old[end:]):
        return None
    try:
        added = loads(b"[" + raw[end + 1:cut] + b"]")
    except JSON_ERRORS:
        return None
    return added or None


def _appended(seen: _Seen, raw: bytes) -> dict[str, Any] | None:
    """`seen`'s body with the items inserted before its list's `]`, or None if `raw` is not that."""
    added = inserted_items(seen.raw, seen.end, raw)
    if added is None:
        return None
    body = dict(seen.body)
    body[seen.key] = seen.body[seen.key] + added  # type: ignore[index]
    return body


def _learn(seen: _Seen, raw: bytes, body: dict[str, Any]) -> tuple[str, int] | None:
    """(key, where items are inserted in `raw`) if `raw` is `seen.raw` with items appended to that
    list. The insertion point is right after the list's last item (before whitespace and `]`)."""
    old = seen.raw
    at = common_prefix(old, raw)
    if at >= len(raw) or raw[at] != 44 or old[at:at + _WHITE_MAX].lstrip()[:1] != b"]":  # 44: ","
        return None
    tail = old[at:]
    cut = len(raw) - len(tail)
    if cut <= at + 1 or not raw.endswith(tail):
        return None
    try:
        added = loads(b"[" + raw[at + 1:cut] + b"]")
    except JSON_ERRORS:
        return None
    if not added or body.keys() != seen.body.keys():
        return None
    grown = [key for key, value in body.items()
             if isinstance(value, list) and isinstance(seen.body[key], list)
             and len(value) == len(seen.body[key]) + len(added)]
    for key in grown:
        if (body[key][-len(added):] == added and body[key][:-len(added)] == seen.body[key]
                and all(body[k] == seen.body[k] for k in body if k != key)):
            return key, cut
    return None


_SEED_KEY = b'{"seed":'


def seed_lead(seed: int | None) -> bytes:
    """How an engine body with this call seed begins: `{"seed":N,` (or `{` without one)."""
    return b'{"seed":%d,' % seed if seed is not None else b"{"


def lead_length(body: bytes) -> int:
    """The length of `body`'s `seed_lead` (a body `EngineBodies` wrote)."""
    return body.index(b",", len(_SEED_KEY)) + 1 if body.startswith(_SEED_KEY) else 1


class EngineBodies:
    """Per-session writer of engine chat bodies; `encode(chat)` equals `dumps(chat)` as JSON."""

    __slots__ = ("_seen", "spliced", "written")

    def __init__(self) -> None:
        # most recent first: (bytes of every field but messages and seed, the messages, the
        # whole body)
        self._seen: list[tuple[bytes, list[Any], bytes]] = []
        self.spliced = 0  # bodies written by splicing the new messages into the last bytes
        self.written = 0  # bodies written in full

    def encode(self, chat: dict[str, Any]) -> bytes:
        messages = chat.get("messages")
        seed = chat.get("seed")
        if not isinstance(messages, list) or not messages or (
                seed is not None and type(seed) is not int):
            return dumps(chat)
        head = dumps({k: v for k, v in chat.items() if k != "messages" and k != "seed"})[:-1]
        lead = seed_lead(seed)
        for index, (seen_head, seen_messages, data) in enumerate(self._seen):
            n = len(seen_messages)
            if (len(messages) > n and seen_head == head
                    and all(map(operator.is_, seen_messages, messages))):
                self.spliced += 1
                data = b"".join((lead, memoryview(data)[lead_length(data):-2], b",",
                                 memoryview(dumps(messages[n:]))[1:-1], b"]}"))
                self._remember(index, (head, list(messages), data))
                return data
        self.written += 1
        data = b"".join((lead, memoryview(head)[1:], b"," if len(head) > 1 else b"",
                         b'"messages":', dumps(messages), b"}"))
        self._remember(None, (head, list(messages), data))
        return data

    def _remember(self, replaces: int | None, seen: tuple[bytes, list[Any], bytes]) -> None:
        if replaces is not None:
            self._seen.pop(replaces)
        self._seen.insert(0, seen)
        del self._seen[KEEP:]
