"""The ASGI app: route table, shared state, and the admin routes.

Admin routes (all need `Authorization: Bearer <admin_key>`; served on the public listener only
when the proxy binds loopback or is told to (`admin_on_public`), otherwise only on the admin
listener on 127.0.0.1; both checked by capture.guard before the route runs):

    POST   /admin/sessions                 {"sampling"?, "metadata"?, "session_id"?,
                                           "step_limit"?, "caps"? (capture.caps)} -> 201
                                           {session_id, secret, base_urls, sampling, caps}
    GET    /admin/sessions                 ids and call counts
    GET    /admin/sessions/{id}/trace      TrainingTrace JSON (streamed), or 409 + reasons
    GET    /admin/sessions/{id}/stats      graph shape, retained/aux/failed counts, tokens, memory,
                                           caps {calls, tokens, *_used, refused, refused_by},
                                           unplaced (calls outside the agent's own
                                           conversation: capture.placement),
                                           failed_calls {total, infra, by_kind} (failure kinds:
                                           capture.sessions.failure_kind), dropped_fields
                                           {field: calls} (capture.allowlist)
    DELETE /admin/sessions/{id}            forget it (and its on-disk log)
    POST   /admin/weight_version           {"version": int, "model"?: str|null, "retired"?:
                                           [engine URL]}: the engines' weights changed (model:
                                           the LoRA adapter serving it); the retired engines (the
                                           push to them failed) are taken out first
                                           (capture.engines)
    GET    /admin/weight_version           {version, model, engines: [{url, sessions, out}]}
    GET    /admin/agent_url                {"url"}: the agent listener, for a local sandbox's
                                           forward (never the admin listener)
    GET    /health                         no key; liveness and how many engines are live,
                                           reveals no session

Agent routes live in `agent_routes` (a call's reply and record in `replies`). Starlette (not
FastAPI): the proxy has a dozen routes and no schema to publish, and every layer between the
socket and the engine is per-call CPU; for the same reason the three model-call routes are
dispatched before Starlette's middleware and router (`CaptureApp`,
`agent_routes.agent_call_asgi`). Every request passes capture.guard's `Gate`
first: keys, the admin listener, and the body's bounds are checked there and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .agent_routes import agent_call_asgi, agent_endpoint, count_tokens, json_object, models, probe
from .calllog import sync_fds
from .engines import EnginePool
from .errors import BadRequest, CaptureError, NothingTrainableError
from .export import iter_trace_json, plan_export
from .guard import Gate, error_response, read_body
from .sessions import SessionStore
from .state import CaptureState, Limits

__all__ = ["CaptureApp", "create_app"]

logger = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = Limits.max_body_bytes


async def _json_body(request: Request, limit: int = 1 << 20) -> dict[str, Any]:
    raw = await read_body(request.receive)
    if len(raw) > limit:
        raise BadRequest("admin request body too large", status=413)
    return json_object(raw) if raw.strip() else {}


def _base_urls(state: CaptureState, request: Request, session_id: str) -> dict[str, str]:
    # an admin listener's own address is no agent's: then the public listener's (`agent_url`)
    root = (state.public_url or state.agent_url or str(request.base_url)).rstrip("/")
    base = f"{root}/s/{session_id}"
    return {"chat": f"{base}/v1", "responses": f"{base}/v1", "messages": base}


async def create_session(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    try:
        body = await _json_body(request)
        session = state.store.create(
            sampling=body.get("sampling"),
            metadata=body.get("metadata"),
            session_id=body.get("session_id"),
            step_limit=body.get("step_limit"),
            caps=body.get("caps"),
        )
    except CaptureError as exc:
        return error_response(exc)
    return JSONResponse(
        {
            "session_id": session.session_id,
            "secret": session.secret,
            "base_urls": _base_urls(state, request, session.session_id),
            "sampling": session.policy.as_dict(),
            "metadata": session.metadata,
            "step_limit": session.step_limit,
            "caps": session.caps.limits(),
        },
        status_code=201,
    )


async def agent_url(request: Request) -> Response:
    """Where agents reach this proxy from this host: the agent listener, never the admin one (a
    sandbox forwarded to the admin listener could try the admin routes). Not the public URL:
    that one is for remote sandboxes, this one is what a local sandbox is forwarded to."""
    state: CaptureState = request.app.state.capture
    return JSONResponse({"url": (state.agent_url or str(request.base_url)).rstrip("/")})


async def list_sessions(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    return JSONResponse(
        {"sessions": [state.store.get(sid).describe() for sid in state.store.ids()]}
    )


async def session_trace(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    try:
        session = state.store.get(request.path_params["session_id"])
        plan = plan_export(session)
        if plan.trainable_tokens == 0:
            raise NothingTrainableError(session.session_id, plan.reasons)
    except CaptureError as exc:
        return error_response(exc)
    return StreamingResponse(iter_trace_json(plan), media_type="application/json")


async def session_stats(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    try:
        session = state.store.get(request.path_params["session_id"])
    except CaptureError as exc:
        return error_response(exc)
    plan = plan_export(session)
    graph = session.graph
    stored_bytes = sum(
        n.seg.itemsize * len(n.seg) + n.completion.itemsize * len(n.completion)
        + n.logprobs.itemsize * len(n.logprobs) for n in graph
    )
    return JSONResponse(
        {
            "session_id": session.session_id,
            "n_calls": session.n_calls,
            "n_ok": len(graph),
            "n_failed": len(session.failed),
            # calls that offered tools (capture.sessions.take_step): served, and refused past
            # the limit (never recorded, never sent on)
            "steps": {"limit": session.step_limit, "taken": session.n_steps,
                      "refused": session.refused_steps},
            # every call of the rollout (capture.caps): limits, used, refused past them
            "caps": session.caps.stats(session.n_calls),
            "in_flight": session.in_flight,
            "graph": graph.stats(),
            **plan.stats(),
            "failures": session.failed[-20:],
            # failed calls by kind, and how many the engine or the proxy caused (helper for the
            # harness's infra_failure cause; kinds in capture.sessions.failure_kind)
            "failed_calls": session.failed_calls(),
            # agent request fields kept from the engine (capture.allowlist): field -> calls
            "dropped_fields": dict(session.dropped_fields),
            "token_bytes": stored_bytes,
            "torn_log_lines": session.torn_log_lines,
            "lost_calls": session.lost_calls,
            # calls sent to the engine ahead of their full translation, and of those, the ones
            # whose translation disagreed and were sent again (capture/early.py; expected 0)
            "early": {"sent": session.early.sent, "mismatched": session.early.mismatched},
            "sampling": session.policy.as_dict(),
            "metadata": session.metadata,
        }
    )


async def delete_session(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    try:
        state.store.delete(request.path_params["session_id"])
        state.engines.release(request.path_params["session_id"])
    except CaptureError as exc:
        return error_response(exc)
    return JSONResponse({"deleted": request.path_params["session_id"]})


async def weight_version(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    try:
        if request.method == "POST":
            body = await _json_body(request)
            version = body.get("version")
            model = body.get("model")
            if isinstance(version, bool) or not isinstance(version, int):
                raise BadRequest('send {"version": <int>, "model": <str or null>}')
            if model is not None and (not isinstance(model, str) or not model):
                raise BadRequest('"model" must be the engine model name serving this version '
                                 "(a LoRA adapter's name), or null for the engine's own")
            retired = body.get("retired") or []
            if not isinstance(retired, list) or not all(isinstance(u, str) for u in retired):
                raise BadRequest('"retired" must be a list of engine URLs')
            # Out before the stamp: no call of an engine that missed `version` is recorded at it.
            for url in retired:
                try:
                    await state.engines.retire(url)
                except ValueError as exc:
                    raise BadRequest(str(exc)) from exc
            # both in one step of the event loop: a call reads them together (CaptureState)
            state.weight_version, state.engine_model = version, model
    except CaptureError as exc:
        return error_response(exc)
    return JSONResponse({"version": state.weight_version, "model": state.engine_model,
                         "engines": state.engines.describe()})


async def health(request: Request) -> Response:
    state: CaptureState = request.app.state.capture
    # Counts only: engine addresses are for the admin key (GET /admin/weight_version).
    return JSONResponse({"ok": bool(state.engines.live), "weight_version": state.weight_version,
                         "engines": {"live": len(state.engines.live),
                                     "total": len(state.engines.members)}})


def create_app(
    engine_url: str | list[str],
    *,
    admin_key: str,
    data_dir: Path | None = None,
    max_body_bytes: int | None = None,
    upstream_timeout_s: float = 600.0,
    public_url: str | None = None,
    limits: Limits | None = None,
    fsync: str = "interval",
    fsync_interval_s: float = 1.0,
) -> CaptureApp:
    """Build the proxy app; recovers sessions from `data_dir` if it holds any.

    `engine_url`: one engine's URL, or several (a list, or "a,b,...": capture.engines).
    `fsync`: the call logs' durability policy (capture.calllog); `limits`: capture.guard
    (`max_body_bytes`, when given, overrides its body bound)."""
    limits = limits or Limits()
    if max_body_bytes is not None:
        limits = dataclasses.replace(limits, max_body_bytes=max_body_bytes)
    if not fsync_interval_s > 0:
        raise ValueError(f"fsync_interval_s must be positive, got {fsync_interval_s!r}")
    store = SessionStore(data_dir, fsync=fsync)
    recovered = store.recover()
    if recovered:
        logger.info("recovered %d session(s) from %s", recovered, data_dir)
    state = CaptureState(
        engines=EnginePool(engine_url, timeout_s=upstream_timeout_s),
        store=store,
        admin_key=admin_key,
        limits=limits,
        public_url=public_url,
    )
    s = "/s/{session_id}"
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/admin/sessions", create_session, methods=["POST"]),
        Route("/admin/sessions", list_sessions, methods=["GET"]),
        Route("/admin/sessions/{session_id}/trace", session_trace, methods=["GET"]),
        Route("/admin/sessions/{session_id}/stats", session_stats, methods=["GET"]),
        Route("/admin/sessions/{session_id}", delete_session, methods=["DELETE"]),
        Route("/admin/weight_version", weight_version, methods=["GET", "POST"]),
        Route("/admin/agent_url", agent_url, methods=["GET"]),
        Route(f"{s}/v1/chat/completions", agent_endpoint("chat"), methods=["POST"]),
        Route(f"{s}/v1/responses", agent_endpoint("responses"), methods=["POST"]),
        Route(f"{s}/v1/messages", agent_endpoint("messages"), methods=["POST"]),
        Route(f"{s}/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        Route(f"{s}/v1/models", models, methods=["GET"]),
        Route(f"{s}/", probe, methods=["GET", "HEAD"]),
        Route(s, probe, methods=["GET", "HEAD"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Starlette streams (SSE replies, the trace export) through an anyio task group, and the
        # first one in a process imports anyio's asyncio backend: ~70 ms measured here, paid by
        # the first streamed agent call or export unless it is paid now, at start-up.
        async with anyio.create_task_group():
            pass
        flusher = (asyncio.get_running_loop().create_task(_flush_logs(store, fsync_interval_s))
                   if data_dir is not None and fsync == "interval" else None)
        try:
            yield
        finally:
            if flusher is not None:
                flusher.cancel()
            store.close()
            await state.engines.aclose()

    app = CaptureApp(routes=routes, lifespan=lifespan)
    app.state.capture = state
    return app


async def _flush_logs(store: SessionStore, interval_s: float) -> None:
    """The "interval" durability policy (capture.calllog): fsync, off the event loop, every log
    written since the last pass."""
    while True:
        await asyncio.sleep(interval_s)
        fds = store.dirty_logs()
        if fds:
            await asyncio.to_thread(sync_fds, fds)


class CaptureApp(Starlette):
    """Starlette, behind capture.guard's `Gate` (every request), with the model calls (the hot
    path) dispatched before Starlette's middleware and router (`agent_call_asgi`)."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            state = self.state.capture
            gate = await Gate.open(state, scope, receive, send)
            if gate is None:  # refused from the head, answered
                return
            try:
                if await agent_call_asgi(state, scope, gate.receive, gate.send):
                    return
                await super().__call__(scope, gate.receive, gate.send)
            finally:
                gate.close()
            return
        await super().__call__(scope, receive, send)
