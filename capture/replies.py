"""A model call's reply and its record: the agent is answered first, the call recorded exactly once.

agent_routes.py checks, translates and forwards a call; this module holds what happens once the
engine answers. A whole reply is sent, then recorded (`AnswerThenRecord`: the agent never waits
on the graph and the log). A streamed one is relayed chunk by chunk through the recorder and the
dialect's encoder (`Relay`, `RelayResponse`), and recorded once however it ends: finished, failed
upstream, an encoder bug, or the agent hanging up. `CallInfo` is what is recorded about a call
besides its tokens; `finish_ok` / `finish_failed` write the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.responses import Response, StreamingResponse

from .aux import aux_hint
from .dialects.base import Dialect, StreamEncoder
from .errors import AgentDisconnected, EngineNoTokenIds, UpstreamError
from .recorder import CallRecorder
from .sessions import Session
from .upstream import EngineStream

if TYPE_CHECKING:
    from .state import CaptureState

__all__ = ["AnswerThenRecord", "CallInfo", "Relay", "RelayResponse", "finish_failed",
           "finish_ok", "truncation"]

logger = logging.getLogger(__name__)

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class CallInfo:
    """What is recorded about a call besides its tokens. The weight version and the clock are read
    as the call starts; the rest is derived from the request when the call is recorded, after the
    agent has its answer, so none of it is on the path the agent waits on."""

    __slots__ = ("body", "chat", "dialect", "dropped", "engine_model", "enforced", "started",
                 "weight_version_start")

    def __init__(self, dialect: Dialect, body: dict[str, Any], chat: dict[str, Any],
                 enforced: dict[str, Any], start: tuple[float, int, str | None],
                 dropped: list[str]) -> None:
        self.dialect, self.body, self.chat, self.enforced = dialect, body, chat, enforced
        self.started, self.weight_version_start, self.engine_model = start
        self.dropped = dropped

    def build(self, state: CaptureState) -> dict[str, Any]:
        chat, body, enforced = self.chat, self.body, self.enforced
        tools = chat.get("tools") if isinstance(chat.get("tools"), list) else []
        messages = chat.get("messages") if isinstance(chat.get("messages"), list) else []
        names = [
            (t.get("function") or {}).get("name") for t in tools
            if isinstance(t, dict) and isinstance(t.get("function"), dict)
        ]
        return {
            "dialect": self.dialect.name,
            "stream": bool(chat.get("stream")),
            "model_requested": body.get("model") if isinstance(body.get("model"), str) else None,
            "n_tools": len(tools),
            "max_tokens_requested": enforced["max_tokens"]["requested"],
            "hint": aux_hint(messages),
            "sampling": enforced,
            "dropped_fields": self.dropped,
            "weight_version_start": self.weight_version_start,
            # LoRA: the adapter that sampled every token of this call (None: the served model)
            "engine_model": self.engine_model,
            "request": {"tools": names, "tool_choice": chat.get("tool_choice")},
            "_messages": messages,
            "weight_version_end": state.weight_version,
            "latency_s": round(time.perf_counter() - self.started, 6),
        }


class AnswerThenRecord(Response):
    """A whole JSON reply: sent to the agent first, then recorded, so the agent never waits on the
    graph and the log.

    The order stays causal: uvicorn's `send` waits for a paused socket *before* writing and never
    after, so nothing runs between the last byte leaving and `record()`; the agent's next call,
    which needs this reply, is handled only after it. `record` runs even if the agent hung up.

    Its head is written here, not by Response's constructor (which renders and inspects the
    content and headers generically): this is every whole model call's answer.
    """

    def __init__(self, content: bytes, record: Callable[[], None]) -> None:
        self.status_code, self.background, self.body = 200, None, content
        self.raw_headers = [(b"content-length", b"%d" % len(content)),
                            (b"content-type", b"application/json")]
        self._record = record

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.body})
        finally:
            self._record()


class Relay:
    """One streaming call: engine chunks -> recorder -> encoder -> agent, recorded exactly once."""

    def __init__(self, state: CaptureState, session: Session, call_id: str, info: CallInfo,
                 recorder: CallRecorder, upstream: EngineStream,
                 encoder: StreamEncoder) -> None:
        self.state, self.session, self.call_id, self.info = state, session, call_id, info
        self.recorder, self.upstream, self.encoder = recorder, upstream, encoder
        self.recorded = False

    async def events(self) -> AsyncIterator[bytes]:
        try:
            told = False
            async for batch in self.upstream.batches():
                if not told and self.upstream.prompt is not None:
                    # cut out of the first event before parsing (capture.tokens), so the chunk
                    # the encoder reads no longer carries it: its length is told here
                    told = True
                    self.encoder.set_prompt_tokens(len(self.upstream.prompt))
                out = []
                for chunk in batch:
                    self.recorder.add_chunk(chunk)
                    out.append(self.encoder.on_chunk(chunk))
                data = b"".join(out)
                if data:
                    yield data
            if self.upstream.prompt is not None:
                self.recorder.set_prompt(self.upstream.prompt)
            self.recorder.check()
            self.recorded = True
            finish_ok(self.state, self.session, self.call_id, self.recorder, self.info)
            tail = self.encoder.finish()
            if tail:
                yield tail
        except UpstreamError as exc:
            self._fail(exc)
            yield self.encoder.fail(exc.message)
        except Exception as exc:  # an encoder bug: end the agent's stream cleanly, say so
            logger.exception("streaming relay failed in session %s", self.session.session_id)
            self.state.dialect_crashes += 1
            self._fail(exc)
            with contextlib.suppress(Exception):
                yield self.encoder.fail(f"capture proxy error: {type(exc).__name__}: {exc}")

    def _fail(self, exc: Exception) -> None:
        if not self.recorded:
            self.recorded = True
            finish_failed(self.state, self.session, self.call_id, exc, self.info)

    async def close(self) -> None:
        """Always runs: records an abandoned call (the agent hung up) and frees the connection."""
        self._fail(AgentDisconnected("the agent closed the connection before the reply ended"))
        await self.upstream.aclose()


class RelayResponse(StreamingResponse):
    """The SSE reply: the relay's events, sent as they come; the relay is closed however it ends.

    Not StreamingResponse's own `__call__`: under uvicorn (ASGI 2.3, whose `send` does not fail
    when the agent has left) it runs every stream in an anyio task group to hear the disconnect.
    Here one plain task waits for it and cancels only this stream, so the engine's generation is
    still abandoned as soon as the agent leaves; a streamed call's proxy CPU went from 2.0-2.4 ms
    to 1.8-2.1 ms here.
    """

    def __init__(self, relay: Relay) -> None:
        super().__init__(relay.events(), media_type="text/event-stream", headers=SSE_HEADERS)
        self._relay = relay

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        stream = asyncio.current_task()
        assert stream is not None
        left = False

        async def hear_disconnect() -> None:
            nonlocal left
            while (await receive())["type"] != "http.disconnect":
                pass
            left = True
            stream.cancel()

        listener = asyncio.get_running_loop().create_task(hear_disconnect())
        try:
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            async for data in self.body_iterator:
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not left or stream.uncancel() > 0:  # cancelled by someone else: theirs to handle
                raise
        finally:
            listener.cancel()
            await self._relay.close()


def finish_ok(state: CaptureState, session: Session, call_id: str, recorder: CallRecorder,
               call: CallInfo) -> None:
    """Record a call the agent was answered for (its recorder passed `check()`)."""
    session.in_flight -= 1
    info = call.build(state)
    try:
        capture = recorder.result()
    except EngineNoTokenIds as exc:  # ids, but not token ids: the agent had its answer
        session.record_failed(call_id, exc, info)
        logger.warning("session %s call %s failed: %s", session.session_id, call_id, exc)
        return
    info["finish_reason"] = capture.finish_reason
    info["truncated"], info["truncated_by"] = truncation(
        capture.finish_reason, call.enforced["max_tokens"], session.policy.max_tokens)
    info["usage"] = capture.usage
    info["masked_logprobs"] = capture.missing_logprobs
    # OpenAI's chat completion shape, whatever the dialect: what OpenEnv's and TRL's trace readers
    # (and any chat tooling) look for.
    info["response"] = {"choices": [{"index": 0, "message": capture.message,
                                     "finish_reason": capture.finish_reason}]}
    try:
        session.record_ok(call_id, capture, info)
    except (ValueError, TypeError, OverflowError) as exc:  # ids that are not int32 token ids
        session.record_failed(call_id, EngineNoTokenIds(f"valid token ids ({exc})"), info)


def truncation(finish: str | None, max_tokens: dict[str, Any], cap: int | None
                ) -> tuple[bool, str | None]:
    """Whether a reply was cut by a token limit, and whose: the proxy's cap (the session's
    `max_tokens` was below what the agent asked, or the agent asked for none), the agent's own
    `max_tokens`, or the engine's context length (no limit was sent)."""
    if finish != "length":
        return False, None
    sent, requested = max_tokens["sent"], max_tokens["requested"]
    if sent is None:
        return True, "context"
    if cap is not None and sent == cap and (requested is None or requested > cap):
        return True, "proxy_cap"
    return True, "agent_max_tokens"


def finish_failed(state: CaptureState, session: Session, call_id: str, error: Exception,
                   call: CallInfo) -> None:
    session.in_flight -= 1
    info = call.build(state)
    session.record_failed(call_id, error, info)
    logger.warning("session %s call %s failed: %s", session.session_id, call_id, error)
