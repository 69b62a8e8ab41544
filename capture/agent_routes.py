"""Agent routes: authenticate, translate, enforce, forward, record, answer in the agent's dialect.

    POST /s/{id}/v1/chat/completions      dialect "chat"       (opencode, mini-swe-agent)
    POST /s/{id}/v1/responses             dialect "responses"  (Codex)
    POST /s/{id}/v1/messages              dialect "messages"   (Claude Code; `?beta=true` ignored)
    POST /s/{id}/v1/messages/count_tokens side route: answered by the dialect, never recorded
    GET  /s/{id}/v1/models                side route: the engine's model, never recorded
    HEAD|GET /s/{id}/                     side route: Claude Code's liveness probe

Order of checks, cheapest and most important first, the first four from the request's head
alone, before any body byte is read (capture.guard's `Gate`, before any route runs): session
exists (404), the key is this session's own (401, nothing recorded), the session is under its
memory bound (413), the declared size (413); then content type (415); the size taken (413, Gate
too); JSON (400); dialect translation (its DialectError status); the engine-field allowlist
(capture.allowlist: fields are dropped and counted, a `stop` past its bounds is a 400); the
session's step limit (403 for a call that offers tools past it, capture.sessions). Only then
is a call id taken and the call recorded (ok or failed), so a rejected request never appears in a
trace.

Per call, one engine request: the dialect's chat body, rewritten to the session's sampling policy
and the capture fields (upstream module docstring). A chat call that is the session's last one with
messages appended leaves for the engine right after the size check, its new messages parsed and
translated on their own, and the full translation that follows is held to it (`capture.early`;
if they ever disagree, that request is cancelled and the full one sent). Streaming replies are
passed to the agent chunk by chunk as the engine makes them, the recorder reading each chunk first.
An engine failure before the first byte becomes a non-streaming error in the agent's dialect
(502/504, or the engine's 4xx); after it, the dialect's mid-stream error event. Either way the call
is recorded as failed. The reply's side (whole or streamed, and the call's record) is
capture.replies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .allowlist import restrict
from .dialects import DIALECTS
from .dialects.base import Dialect, DialectError
from .early import EarlyCall
from .errors import BadRequest, CaptureError, StepLimitReached, UpstreamError
from .guard import SESSION, Headers, error_response, header, read_body
from .recorder import CallRecorder
from .replies import AnswerThenRecord, CallInfo, Relay, RelayResponse, finish_failed, finish_ok
from .sessions import Session
from .upstream import JSON_ERRORS, dumps, loads

if TYPE_CHECKING:
    from .state import CaptureState

__all__ = ["agent_call_asgi", "agent_endpoint", "count_tokens", "json_object", "models", "probe"]

logger = logging.getLogger(__name__)


async def _read_raw(headers: Headers, receive: Any) -> bytes:
    """The request's bytes, once its type is acceptable (415; 400 if empty). Its size and read
    time are capture.guard's, kept as `receive` gives the bytes."""
    ctype = (header(headers, b"content-type") or "application/json").split(";")[0].strip().lower()
    if ctype and ctype != "application/json" and not ctype.endswith("+json"):
        raise BadRequest(f"content-type must be application/json, got {ctype[:80]!r}", status=415)
    raw = await read_body(receive)
    if not raw.strip():
        raise BadRequest("request body is empty; send a JSON object")
    return raw


def json_object(raw: bytes, parse: Callable[[bytes], Any] = loads) -> dict[str, Any]:
    """A request body that must be a JSON object (400 otherwise): agent and admin routes."""
    try:
        body = parse(raw)
    except JSON_ERRORS as exc:
        raise BadRequest(f"request body is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def agent_endpoint(dialect_name: str):
    """The route handler for one dialect's model-call route (a model call that
    `agent_call_asgi` did not take, such as one under a root path)."""
    dialect = DIALECTS[dialect_name]

    async def agent_call(request: Request) -> Response:
        return await _agent_call(request.app.state.capture, request.scope[SESSION],
                                 request.scope["headers"], request.receive, dialect)

    agent_call.__name__ = f"agent_call_{dialect_name}"
    return agent_call


# The model-call routes by what follows `/s/{id}/`: served before Starlette's middleware and
# router (`agent_call_asgi`).
_CALL_ROUTES = {"v1/chat/completions": DIALECTS["chat"], "v1/responses": DIALECTS["responses"],
                "v1/messages": DIALECTS["messages"]}


async def agent_call_asgi(state: CaptureState, scope: dict[str, Any], receive: Any, send: Any
                          ) -> bool:
    """Serve a model call (POST to exactly `/s/{id}/v1/<model-call route>`, its session admitted
    by capture.guard) and return True; return False, having done nothing, for anything else.

    Why not the route table: every call would pass through Starlette's error and exception
    middleware, its router (a regex per route until one matches) and its wrappers before reaching
    `_agent_call`, 0.15-0.2 ms of CPU per call on this machine, on the path the agent waits on.
    The handler is the same one behind the route table's paths; what it skips is the layering."""
    path: str = scope["path"]
    if scope["method"] != "POST" or not path.startswith("/s/"):
        return False
    dialect = _CALL_ROUTES.get(path[3:].partition("/")[2])
    session = scope.get(SESSION)
    if dialect is None or session is None:
        return False
    response = await _agent_call(state, session, scope["headers"], receive, dialect)
    await response(scope, receive, send)
    return True


async def _agent_call(state: CaptureState, session: Session, headers: Headers, receive: Any,
                      dialect: Dialect) -> Response:
    """`session`: admitted from the head by capture.guard."""
    # the version and the model serving it, read together (LoRA: the adapter of that version)
    started, weight_version = time.perf_counter(), state.weight_version
    engine_model = state.engine_model
    early: EarlyCall | None = None
    try:
        raw = await _read_raw(headers, receive)
        session.check_caps()  # every call of every agent, before any is sent (capture.caps)
        early = _send_early(state, session, dialect, raw)
        body = json_object(raw, session.reader.read)
        try:
            chat = dialect.to_chat(body, session.memo)
        except DialectError:
            raise
        except Exception as exc:  # a dialect bug on hostile input must not become a 500
            logger.exception("dialect %s failed on a request", dialect.name)
            state.dialect_crashes += 1
            raise BadRequest(
                f"could not translate the request: {type(exc).__name__}: {exc}"
            ) from exc
    except (CaptureError, DialectError) as exc:
        if early is not None:
            early.cancel()
        return error_response(exc, dialect)
    try:
        return await _forward(state, session, dialect, raw, body, chat, early,
                              (started, weight_version, engine_model))
    finally:
        if early is not None:
            early.cancel()  # not taken (the full path wrote another body, or failed first)


def _send_early(state: CaptureState, session: Session, dialect: Dialect, raw: bytes
                ) -> EarlyCall | None:
    """The engine request of a call that extends one of the session's last chat calls, sent now,
    before the full translation (capture.early); None for any other call."""
    translate = dialect.message_translator()
    if state.engine_model != session.early.model:
        return None  # a LoRA push named another adapter: the remembered bodies name the old one
    # The seed of the number this call takes if no other call of the session comes first.
    ahead = session.early.body_for(raw, translate, session.policy.seed_for(session.n_calls + 1)
                                   ) if translate is not None else None
    if ahead is None:
        return None
    body, stream = ahead
    try:
        engine = state.engines.engine_for(session.session_id)
    except UpstreamError:  # no engine left: the full path records the failed call
        return None
    session.early.sent += 1
    return EarlyCall(body, stream, engine.open_stream(body) if stream else engine.complete(body))


async def _forward(state: CaptureState, session: Session, dialect: Dialect, raw: bytes,
                   body: dict[str, Any], chat: dict[str, Any], early: EarlyCall | None,
                   start: tuple[float, int, str | None]) -> Response:
    """`start`: the clock, the engine's weight version and the model serving it (a LoRA
    adapter, or None for the engine's own) when the call arrived."""
    try:
        dropped = restrict(chat)  # capture.allowlist: only the trainer's policy reaches the engine
        if chat.get("tools"):  # a step of the agent's own (capture.sessions.take_step)
            session.take_step()
    except (BadRequest, StepLimitReached) as exc:
        return error_response(exc, dialect)
    enforced = session.policy.enforce(chat)
    chat["logprobs"] = True
    chat["top_logprobs"] = 0
    chat["return_token_ids"] = True
    stream = bool(chat.get("stream"))
    info = CallInfo(dialect, body, chat, enforced, start, dropped)
    try:
        # The session's engine (capture.engines: the same one for all its calls). The model is
        # set here, never by the agent: a LoRA run's adapter of the call's version, else the
        # engine's one served model.
        engine = state.engines.engine_for(session.session_id)
        chat["model"] = start[2] or await engine.served_model()
    except UpstreamError as exc:  # the engine is down: a failed call, counted for the rollout
        call_id = session.next_call_id()
        session.in_flight += 1
        finish_failed(state, session, call_id, exc, info)
        return error_response(exc, dialect)
    call_id = session.next_call_id()
    session.in_flight += 1
    # Written after the allowlist dropped the agent's own seed (capture.sampling: the call's
    # number decides it, and it is recorded with the call).
    enforced["seed"] = seed = session.policy.seed_for(session.n_calls)
    if seed is not None:
        chat["seed"] = seed
    recorder = CallRecorder()
    engine_body = session.engine_bodies.encode(chat)
    if dialect.message_translator() is not None:
        session.early.remember(raw, session.reader.growing(raw), engine_body, stream,
                               info.engine_model)
    sent = _take_early(session, early, engine_body, stream)
    if not stream:
        try:
            reply, prompt = await (sent or engine.complete(engine_body))
            recorder.add_reply(reply, prompt)
            recorder.check()
        except UpstreamError as exc:
            finish_failed(state, session, call_id, exc, info)
            return error_response(exc, dialect)
        try:
            answer = dumps(dialect.from_chat(reply, body))
        except Exception as exc:  # a dialect bug must still answer in the agent's shape
            finish_ok(state, session, call_id, recorder, info)
            logger.exception("dialect %s failed on an engine reply", dialect.name)
            state.dialect_crashes += 1
            return error_response(
                CaptureError(f"could not translate the engine reply: {exc}"), dialect)
        return AnswerThenRecord(answer, lambda: finish_ok(
            state, session, call_id, recorder, info))
    try:
        upstream = await (sent or engine.open_stream(engine_body))
    except UpstreamError as exc:
        finish_failed(state, session, call_id, exc, info)
        return error_response(exc, dialect)
    relay = Relay(state, session, call_id, info, recorder, upstream,
                   dialect.stream_encoder(body))
    return RelayResponse(relay)


def _take_early(session: Session, early: EarlyCall | None, engine_body: bytes, stream: bool
                ) -> asyncio.Task[Any] | None:
    """The early request's task when it sent exactly `engine_body`; otherwise it is cancelled,
    counted and logged (the caller sends `engine_body` itself), or there was none: None."""
    if early is None:
        return None
    sent = early.take(engine_body, stream)
    if sent is None:
        session.early.mismatched += 1
        logger.warning("session %s: the engine body sent ahead was not the full translation's; "
                       "it was cancelled and the call sent again", session.session_id)
    return sent


# --- side routes (never recorded; their session's key is checked by capture.guard) --------------
async def count_tokens(request: Request) -> Response:
    dialect = DIALECTS["messages"]
    try:
        body = json_object(await _read_raw(request.scope["headers"], request.receive))
        answer = dialect.count_tokens(body)
    except (CaptureError, DialectError) as exc:
        return error_response(exc, dialect)
    except Exception as exc:  # same rule as to_chat: hostile input never becomes a 500
        logger.exception("count_tokens failed")
        return error_response(
            BadRequest(f"could not count tokens: {type(exc).__name__}"), dialect)
    if answer is None:
        return error_response(
            BadRequest("this dialect has no token-count route", status=404), dialect)
    return JSONResponse(answer)


async def models(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    dialect = DIALECTS["chat"]
    try:
        name = await state.engines.engine_for(request.scope[SESSION].session_id).served_model()
    except CaptureError as exc:
        return error_response(exc, dialect)
    created = int(time.time())
    return JSONResponse({
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "capture",
                  # Anthropic's models list shape, for agents that list models that way.
                  "type": "model", "display_name": name}],
    })


async def probe(request: Request) -> Response:
    """Answered once capture.guard has admitted the session's key."""
    if request.method == "HEAD":
        return Response(status_code=200)
    return JSONResponse({"ok": True})

