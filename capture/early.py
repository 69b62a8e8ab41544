"""Send a resent chat call to the engine before translating it; check the translation agrees.

Why: the agent's call waits on everything the proxy does before the engine request leaves:
authenticate, parse, translate, enforce the policy, serialise. Measured in bench/capture on this
2-core machine, that is ~0.35 ms of CPU per call, most of it cold caches (each step costs several
times what it does warm); a proxy variant that did none of it before sending answered 0.33 ms
sooner, one for one. The work itself is needed, but not before the engine starts.

How: a coding agent's next chat call is its last one with messages appended (`resent.py`). For
such a call the engine body is known ahead: the last call's engine body with the new messages,
translated, spliced in before its closing `]}`. That is byte for byte what the full path writes for
it (`EngineBodies` splices the same way, and its full write is the same bytes), so that body is
sent at once. The call's engine seed (capture.sampling) is the
one its call number will have, `{"seed":N,` in place of the last body's (`resent.seed_lead`): a
call of the session that reaches the engine between the two takes that number, and the bodies then
differ (below). The full path then runs as before while the engine works, and its engine body is
compared with the one sent:

  * equal (every call, unless something between the two calls changed): the engine's reply is
    the call's;
  * different: the early request is cancelled (its connection is closed, which makes vLLM abort
    it) and the full path's body is sent, as if there had been no early send. `mismatched` counts
    them; tests hold it at zero.

Checked before the early send, as for any call: the session's key, the body's type and size. Then:
the bytes are the last request's with `,<items>` inserted before the end of its messages (one
memcmp), the items parse, and each passes the dialect's message translation. Anything else takes
the full path alone, which answers any error without reaching the engine. Only the chat dialect
sends early: its messages go to the engine one for one; the other dialects' translations are not
item-for-item splices of the engine body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from .resent import inserted_items, lead_length, seed_lead
from .upstream import EngineStream, dumps

__all__ = ["EarlyBodies", "EarlyCall"]

# Conversations remembered per session, most recent first (a title call or a subagent interleaves
# with the main thread).
KEEP = 3

Translate = Callable[[int, Any], list[Any]]


class _Sent:
    """One chat request the full path served: its bytes, where its messages end in them, how many
    there were, the engine body it became, and whether it streamed."""

    __slots__ = ("end", "engine_body", "n_messages", "raw", "stream")

    def __init__(self, raw: bytes, end: int, n_messages: int, engine_body: bytes,
                 stream: bool) -> None:
        self.raw, self.end, self.n_messages = raw, end, n_messages
        self.engine_body, self.stream = engine_body, stream


class EarlyBodies:
    """Per session: the engine body of a chat call that extends a remembered one, ahead of the
    full translation (`body_for`), and what the full path wrote (`remember`)."""

    __slots__ = ("_sent", "mismatched", "model", "sent")

    def __init__(self) -> None:
        self._sent: list[_Sent] = []
        # The engine model the remembered bodies name (a LoRA run's adapter, None: the served
        # one): after a push names another adapter, no remembered body is the call's.
        self.model: str | None = None
        self.sent = 0  # calls whose engine request left before their full translation
        self.mismatched = 0  # ... and whose full translation then disagreed (sent again)

    def body_for(self, raw: bytes, translate: Translate, seed: int | None = None
                 ) -> tuple[bytes, bool] | None:
        """(engine body, stream) for `raw` if it is a remembered request with messages appended,
        each of which `translate(index, message)` accepts; else None. `seed`: the call's engine
        seed (None: none)."""
        for sent in self._sent:
            added = inserted_items(sent.raw, sent.end, raw)
            if added is None:
                continue
            try:
                translated = [out for i, item in enumerate(added, sent.n_messages)
                              for out in translate(i, item)]
            except Exception:  # a DialectError, or a translator bug on hostile input
                return None  # the full path says what is wrong with it
            body = memoryview(sent.engine_body)[lead_length(sent.engine_body):]
            if not translated:
                return b"".join((seed_lead(seed), body)), sent.stream
            # one copy of the history's bytes, not one per `+`
            return b"".join((seed_lead(seed), body[:-2], b",",
                             memoryview(dumps(translated))[1:-1], b"]}")), sent.stream
        return None

    def remember(self, raw: bytes, growing: tuple[str, int, int] | None, engine_body: bytes,
                 stream: bool, model: str | None = None) -> None:
        """What the full path made of a chat request: `growing` is `RequestReader.growing(raw)`.
        Kept only when the request's messages are the list that grows and end the engine body."""
        if growing is None or growing[0] != "messages" or not engine_body.endswith(b"]}"):
            return
        if model != self.model:  # bodies naming another adapter can never be a call's again
            self._sent.clear()
            self.model = model
        _, end, n_messages = growing
        # the same conversation one call further replaces its last call
        self._sent = [s for s in self._sent
                      if len(raw) <= len(s.raw) or not raw.startswith(memoryview(s.raw)[:s.end])]
        self._sent.insert(0, _Sent(raw, end, n_messages, engine_body, stream))
        del self._sent[KEEP:]


class EarlyCall:
    """An engine request sent ahead of the full translation: `take` it if the full path wrote the
    same body (and streams alike), else it is cancelled; `cancel` it on any way out."""

    __slots__ = ("body", "stream", "task")

    def __init__(self, body: bytes, stream: bool, start: Coroutine[Any, Any, Any]) -> None:
        self.body, self.stream = body, stream
        # Eager: the request is written now, inside this call, not one loop iteration later.
        self.task: asyncio.Task[Any] | None = asyncio.Task(
            start, loop=asyncio.get_running_loop(), eager_start=True)

    def take(self, body: bytes, stream: bool) -> asyncio.Task[Any] | None:
        """The early request's task if it is this body's, else None (and it is cancelled)."""
        task = self.task
        if task is not None and body == self.body and stream == self.stream:
            self.task = None
            return task
        self.cancel()
        return None

    def cancel(self) -> None:
        """Abandon the early request: the engine is told (its connection closes) if it is still
        working; a stream it already opened is closed; a failure it had is not reported."""
        task, self.task = self.task, None
        if task is None:
            return
        if not task.done():
            task.cancel()
            return
        if task.cancelled():
            return
        if task.exception() is None:  # retrieved either way: a failure nobody awaits is not logged
            result = task.result()
            if isinstance(result, EngineStream):  # opened: give its connection back or close it
                result.release()
