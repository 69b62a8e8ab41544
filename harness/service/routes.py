"""The rollout service's HTTP routes (serve.py's docstring lists them): auth, JSON, long polls.

Every route but /health wants the service key; each handler gets the `RolloutService` and the
JSON body, and answers a refusal 400, an unknown id 404, a session failure 422 with
{"error": {type, cause, retryable, message}} (`failure_reply`) so the client raises the same
`harness.shared.errors` class; every refusal has that one shape (`error_reply`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from harness.service.state import (
    BadRequest,
    RolloutService,
    error_reply,
    failure_reply,
    result_json,
)

__all__ = ["create_app"]

MAX_POLL_S = 30.0  # the longest a long poll holds a request open


def _service(request: Request) -> RolloutService:
    return request.app.state.service


def _authorized(request: Request) -> bool:
    # As bytes: a header with non-ASCII characters is a wrong key (401), never a TypeError (500).
    given = request.headers.get("authorization", "").encode("utf-8", "surrogateescape")
    return secrets.compare_digest(given, f"Bearer {_service(request).key}".encode())


def _route(handler: Any) -> Any:
    """Auth, JSON bodies and errors for every route but /health, in one place."""
    async def wrapped(request: Request) -> Response:
        if not _authorized(request):
            return error_reply(401, "Unauthorized",
                               "send the service key as 'Authorization: Bearer <key>'")
        try:
            body: dict[str, Any] = {}
            if request.method in ("POST", "PUT"):
                raw = await request.body()
                body = json.loads(raw) if raw else {}
                if not isinstance(body, dict):
                    raise BadRequest("the body must be a JSON object")
            return await handler(request, _service(request), body)
        except (BadRequest, json.JSONDecodeError) as exc:
            return error_reply(400, "BadRequest", str(exc))
        except KeyError as exc:
            return error_reply(404, "NotFound", f"no {exc.args[0]} here (finished and fetched, "
                               "or never made)")
    return wrapped


async def health(request: Request) -> Response:
    s = _service(request)
    return JSONResponse({"ok": True, "in_flight": s.in_flight, "max_sessions": s.max_sessions})


async def metrics(request: Request, s: RolloutService, body: dict) -> Response:
    return JSONResponse(s.metrics())


async def weight_version(request: Request, s: RolloutService, body: dict) -> Response:
    version = body.get("version")
    model = body.get("model")
    if isinstance(version, bool) or not isinstance(version, int):
        raise BadRequest('send {"version": <int>, "model": <str or null>}')
    if model is not None and (not isinstance(model, str) or not model):
        raise BadRequest('"model": the engine model name serving this version (a LoRA '
                         "adapter), or null")
    retired = body.get("retired") or []
    if not isinstance(retired, list) or not all(isinstance(u, str) for u in retired):
        raise BadRequest('"retired" must be a list of engine URLs')
    await s.set_weight_version(version, model, retired=retired)
    return JSONResponse({"version": version, "model": model})


def _wait_s(value: Any) -> float:
    try:
        return max(0.0, min(MAX_POLL_S, float(value or 0.0)))
    except (TypeError, ValueError):
        raise BadRequest(f"wait_s must be a number of seconds, not {value!r}") from None


async def list_tasks(request: Request, s: RolloutService, body: dict) -> Response:
    """The tasks a split spec loads to here, in the order seeds pick them (seed k: k % n)."""
    from harness.tasks import load_tasks

    split, count = body.get("split") or s.tasks, body.get("task_count")
    try:
        tasks = await asyncio.to_thread(load_tasks, split, count=count)
    except Exception as exc:  # every loader error names its fix
        raise BadRequest(f"tasks {split!r}: {exc}") from exc
    if not tasks:
        raise BadRequest(f"tasks {split!r}: no tasks found")
    return JSONResponse({"split": split, "tasks": [t.full_name or t.name for t in tasks]})


async def create_rollout(request: Request, s: RolloutService, body: dict) -> Response:
    known = await s.already_started(body.get("request_id"))
    if known is not None:  # sent again after its answer was lost: the same rollout, no second
        return JSONResponse({"id": known}, 202)
    busy = s.admit()
    if busy is not None:
        return busy
    return JSONResponse({"id": await s.start_rollout(body)}, 202)


async def get_rollout(request: Request, s: RolloutService, body: dict) -> Response:
    rid = request.path_params["rid"]
    job = s.rollouts.get(rid)
    if job is None:
        raise KeyError(f"rollout {rid}")
    await asyncio.wait({job.task}, timeout=_wait_s(request.query_params.get("wait_s")))
    if not job.task.done():
        return JSONResponse({"done": False})
    s.hand_over(rid)  # the client holds it now (kept a minute for a poll sent again)
    if job.task.cancelled():
        return JSONResponse({"done": True, "result": None, "error": "cancelled"})
    return JSONResponse({"done": True, "result": result_json(job.task.result())})


async def delete_rollout(request: Request, s: RolloutService, body: dict) -> Response:
    job = s.forget(request.path_params["rid"])
    if job is not None and not job.task.done():
        job.task.cancel()
        await asyncio.wait({job.task})
    return JSONResponse({"deleted": request.path_params["rid"]})


async def create_session(request: Request, s: RolloutService, body: dict) -> Response:
    known = await s.already_started(body.get("request_id"))
    held = s.sessions.get(known) if known is not None else None
    if held is not None and held.session is not None:  # sent again after its answer was lost
        return JSONResponse({"id": known, "task_id": held.session.task_id})
    busy = s.admit()
    if busy is not None:
        return busy
    try:
        sid, session = await s.start_session(body)
    except BadRequest:
        raise
    except Exception as exc:
        return failure_reply(exc)
    return JSONResponse({"id": sid, "task_id": session.task_id})


async def wait_session(request: Request, s: RolloutService, body: dict) -> Response:
    with s.using_session(request.path_params["sid"]) as held:
        if held.waiter is None:
            held.waiter = asyncio.create_task(
                held.session.a_wait_for_completion(body.get("timeout_s")))
        await asyncio.wait({held.waiter}, timeout=_wait_s(body.get("wait_s")))
    if not held.waiter.done():
        return JSONResponse({"done": False})
    exc = held.waiter.exception()
    if exc is not None:
        return failure_reply(exc)
    return JSONResponse({"done": True, "exit_code": held.waiter.result(),
                         "timed_out": held.session.timed_out})


async def session_trace(request: Request, s: RolloutService, body: dict) -> Response:
    with s.using_session(request.path_params["sid"]) as held:
        try:
            trace = await held.session.a_fetch_training_trace()
        except Exception as exc:
            return failure_reply(exc)
    return JSONResponse({"trace": trace.model_dump(mode="json"),
                         "entries": trace.to_trace_entries()})


async def verify_session(request: Request, s: RolloutService, body: dict) -> Response:
    with s.using_session(request.path_params["sid"]) as held:
        if held.verdict is None:  # graded once: a verify sent again gets this same verdict
            s.sessions_graded += 1
            held.verdict = asyncio.create_task(held.session.a_verify(body.get("transcript")))
        await asyncio.wait({held.verdict})
    exc = held.verdict.exception()
    if exc is not None:
        return failure_reply(exc)
    verdict = held.verdict.result()
    return JSONResponse({"env_reward": verdict.env_reward, "done": verdict.done,
                         "metrics": verdict.metrics, "artifacts": verdict.artifacts})


async def close_session(request: Request, s: RolloutService, body: dict) -> Response:
    await s.close_session(request.path_params["sid"])
    return JSONResponse({"closed": request.path_params["sid"]})


def create_app(service: RolloutService) -> Starlette:
    app = Starlette(routes=[
        Route("/health", health),
        Route("/metrics", _route(metrics)),
        Route("/v1/weight_version", _route(weight_version), methods=["POST"]),
        Route("/v1/tasks", _route(list_tasks), methods=["POST"]),
        Route("/v1/rollouts", _route(create_rollout), methods=["POST"]),
        Route("/v1/rollouts/{rid}", _route(get_rollout), methods=["GET"]),
        Route("/v1/rollouts/{rid}", _route(delete_rollout), methods=["DELETE"]),
        Route("/v1/sessions", _route(create_session), methods=["POST"]),
        Route("/v1/sessions/{sid}/wait", _route(wait_session), methods=["POST"]),
        Route("/v1/sessions/{sid}/trace", _route(session_trace), methods=["GET"]),
        Route("/v1/sessions/{sid}/verify", _route(verify_session), methods=["POST"]),
        Route("/v1/sessions/{sid}", _route(close_session), methods=["DELETE"]),
    ])
    app.state.service = service
    return app
