"""Token ids kept as the engine wrote them (`b"1,2,3"`), so a call costs O(its new tokens).

Measured on this machine (CPU time): turning a 15k-id `prompt_token_ids` into Python ints costs
~0.8 ms (orjson) and into an `array('i')` another ~0.6 ms, while comparing the same ids as bytes is
a memcmp (~0.02 ms). At 41k ids that parse alone would be ~4 ms per call, growing with the history.
So the prompt ids are cut out of the engine's raw reply before it is parsed (`split_prompt_ids`),
compared to the parent's ids as text, and only the tokens after the parent's end are parsed.

Refuses to guess: ids are accepted only from the reply's top-level `prompt_token_ids` list; if the
first occurrence of that key is not the top-level one, the reply is parsed the slow, certain way.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import orjson

__all__ = ["IdText", "split_prompt_ids"]

_KEY = b'"prompt_token_ids":'
_SPACES = b" \t\r\n"


class IdText:
    """Comma-separated decimal ids without brackets or spaces, plus their count."""

    __slots__ = ("_n", "text")

    def __init__(self, text: bytes) -> None:
        if b" " in text or b"\n" in text:
            text = text.replace(b" ", b"").replace(b"\n", b"").replace(b"\r", b"")
        self.text = text
        self._n = -1

    @property
    def n(self) -> int:
        """How many ids (counted on first use: the usual call, a hot leaf's child, never asks)."""
        if self._n < 0:
            self._n = self.text.count(b",") + 1 if self.text else 0
        return self._n

    @classmethod
    def from_ids(cls, ids: Iterable[int]) -> IdText:
        return cls(",".join(map(str, ids)).encode())

    def __len__(self) -> int:
        return self.n

    def ids(self) -> array:
        return parse_ids(self.text)

    def extends(self, whole: bytes) -> bool:
        """Whether these ids start with the ids in `whole` (same text, then a comma or the end)."""
        size = len(whole)
        return self.text.startswith(whole) and (
            len(self.text) == size or self.text[size] == 44  # ord(",")
        )

    def ids_after(self, whole: bytes) -> array:
        """The ids after the prefix `whole` (which `extends` accepted)."""
        return parse_ids(self.text[len(whole) + 1 :])


def parse_ids(text: bytes) -> array:
    """`b"1,2,3"` -> array('i'); raises ValueError / TypeError / OverflowError on bad ids."""
    if not text:
        return array("i")
    return array("i", orjson.loads(b"[" + text + b"]"))


def split_prompt_ids(raw: bytes) -> tuple[bytes, IdText | None]:
    """Cut the first `"prompt_token_ids": [...]` out of raw JSON (replaced by null).

    Returns (the JSON with the list replaced by `null`, the ids) or (raw, None) when there is no
    such list. The caller checks that the top-level key of the parsed reply is then `None`; if it
    is not, the cut list was a nested one and the reply must be read without this shortcut.
    """
    key = raw.find(_KEY)
    if key < 0:
        return raw, None
    start = key + len(_KEY)
    while start < len(raw) and raw[start] in _SPACES:
        start += 1
    if start >= len(raw) or raw[start] != 91:  # ord("[")
        return raw, None
    end = raw.find(b"]", start)
    if end < 0:
        return raw, None
    return raw[:start] + b"null" + raw[end + 1 :], IdText(raw[start + 1 : end])
