"""Python clients for the proxy's admin API: `CaptureClient` (sync) and `AsyncCaptureClient`.

    client = CaptureClient(proxy.url, proxy.admin_key)
    info = client.create_session(sampling={"temperature": 1.0, "max_tokens": 4096})
    # agent: base URL info.base_urls[dialect], API key info.secret
    trace = client.training_trace(info.session_id)   # openenv TrainingTrace, validated
    client.delete_session(info.session_id)

Errors come back as the proxy's exception tree (capture.errors): 401 -> BadSessionKey, 404 ->
UnknownSession, 409 on a trace -> NothingTrainableError with the proxy's reasons, other failures
-> CaptureError naming the status and the proxy's message.

The request/response logic is written once (`_Calls`, no I/O) and the I/O twice, the httpx way.
`openenv` is imported only inside `training_trace`: importing it costs seconds (its package
`__init__` pulls its web stack), and the proxy process itself never needs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx

from .errors import BadRequest, BadSessionKey, CaptureError, NothingTrainableError, UnknownSession

if TYPE_CHECKING:
    from openenv.core.harness.training import TrainingTrace

__all__ = ["AsyncCaptureClient", "CaptureClient", "SessionInfo"]


@dataclass(frozen=True)
class SessionInfo:
    """A created session: hand `base_urls[dialect]` and `secret` to the agent."""

    session_id: str
    secret: str = field(repr=False)
    base_urls: dict[str, str]
    sampling: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


def _raise_for(response: httpx.Response, session_id: str | None = None) -> None:
    if response.status_code < 400:
        return
    try:
        body = response.json()
    except ValueError:
        body = {}
    error = body.get("error") if isinstance(body, dict) else None
    message = (error or {}).get("message") if isinstance(error, dict) else None
    message = message or response.text[:500] or f"HTTP {response.status_code}"
    status = response.status_code
    if status == 409 and isinstance(body, dict) and "reasons" in body:
        raise NothingTrainableError(session_id or "?", list(body["reasons"]))
    if status == 401:
        raise BadSessionKey(message)
    if status == 404 and session_id is not None:
        raise UnknownSession(session_id)
    if 400 <= status < 500:
        raise BadRequest(message, status=status)
    error_obj = CaptureError(f"capture proxy answered HTTP {status}: {message}")
    error_obj.status = status
    raise error_obj


def _parse_trace(content: bytes) -> TrainingTrace:
    from openenv.core.harness.training import TrainingTrace

    return TrainingTrace.model_validate_json(content)


class _Calls:
    """Request shapes shared by both clients (no I/O here)."""

    @staticmethod
    def version_body(version: int, model: str | None,
                     retired: list[str] | None) -> dict[str, Any]:
        return {"version": version, "model": model,
                **({"retired": list(retired)} if retired else {})}

    @staticmethod
    def create_body(sampling: dict[str, Any] | None, metadata: dict[str, Any] | None,
                    session_id: str | None, step_limit: int | None = None,
                    caps: dict[str, int | None] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {}
        if caps is not None:
            body["caps"] = caps
        if step_limit is not None:
            body["step_limit"] = step_limit
        if sampling is not None:
            body["sampling"] = sampling
        if metadata is not None:
            body["metadata"] = metadata
        if session_id is not None:
            body["session_id"] = session_id
        return body

    @staticmethod
    def session_info(response: httpx.Response) -> SessionInfo:
        _raise_for(response)
        data = response.json()
        return SessionInfo(
            session_id=data["session_id"],
            secret=data["secret"],
            base_urls=data["base_urls"],
            sampling=data.get("sampling") or {},
            metadata=data.get("metadata") or {},
        )


class CaptureClient:
    """Blocking admin client. Thread-safe (one httpx.Client with its own pool)."""

    def __init__(self, url: str, admin_key: str, *, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url,
            headers={"authorization": f"Bearer {admin_key}"},
            timeout=timeout_s,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CaptureClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_session(self, sampling: dict[str, Any] | None = None,
                       metadata: dict[str, Any] | None = None,
                       session_id: str | None = None, step_limit: int | None = None,
                       caps: dict[str, int | None] | None = None) -> SessionInfo:
        """`caps`: the rollout's caps on every call (capture.caps)."""
        body = _Calls.create_body(sampling, metadata, session_id, step_limit, caps)
        return _Calls.session_info(self._http.post("/admin/sessions", json=body))

    def trace_json(self, session_id: str) -> bytes:
        """The raw TrainingTrace JSON (raises NothingTrainableError on 409)."""
        response = self._http.get(f"/admin/sessions/{session_id}/trace")
        _raise_for(response, session_id)
        return response.content

    def training_trace(self, session_id: str) -> TrainingTrace:
        return _parse_trace(self.trace_json(session_id))

    def stats(self, session_id: str) -> dict[str, Any]:
        response = self._http.get(f"/admin/sessions/{session_id}/stats")
        _raise_for(response, session_id)
        return response.json()

    def list_sessions(self) -> list[dict[str, Any]]:
        response = self._http.get("/admin/sessions")
        _raise_for(response)
        return response.json()["sessions"]

    def delete_session(self, session_id: str) -> None:
        _raise_for(self._http.delete(f"/admin/sessions/{session_id}"), session_id)

    def set_weight_version(self, version: int, model: str | None = None, *,
                           retired: list[str] | None = None) -> None:
        """`model`: the engine model name that serves `version` (a LoRA adapter); None: the
        engines' own served model. `retired`: engines that missed `version` (their push failed),
        taken out first."""
        _raise_for(self._http.post("/admin/weight_version",
                                   json=_Calls.version_body(version, model, retired)))


class AsyncCaptureClient:
    """The same API, async. Create one per event loop."""

    def __init__(self, url: str, admin_key: str, *, timeout_s: float = 120.0) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers={"authorization": f"Bearer {admin_key}"},
            timeout=timeout_s,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCaptureClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def create_session(self, sampling: dict[str, Any] | None = None,
                             metadata: dict[str, Any] | None = None,
                             session_id: str | None = None, step_limit: int | None = None,
                             caps: dict[str, int | None] | None = None) -> SessionInfo:
        """`caps`: the rollout's caps on every call (capture.caps)."""
        body = _Calls.create_body(sampling, metadata, session_id, step_limit, caps)
        return _Calls.session_info(await self._http.post("/admin/sessions", json=body))

    async def trace_json(self, session_id: str) -> bytes:
        response = await self._http.get(f"/admin/sessions/{session_id}/trace")
        _raise_for(response, session_id)
        return response.content

    async def training_trace(self, session_id: str) -> TrainingTrace:
        return _parse_trace(await self.trace_json(session_id))

    async def stats(self, session_id: str) -> dict[str, Any]:
        response = await self._http.get(f"/admin/sessions/{session_id}/stats")
        _raise_for(response, session_id)
        return response.json()

    async def list_sessions(self) -> list[dict[str, Any]]:
        response = await self._http.get("/admin/sessions")
        _raise_for(response)
        return response.json()["sessions"]

    async def delete_session(self, session_id: str) -> None:
        _raise_for(await self._http.delete(f"/admin/sessions/{session_id}"), session_id)

    async def set_weight_version(self, version: int, model: str | None = None, *,
                                 retired: list[str] | None = None) -> None:
        _raise_for(await self._http.post("/admin/weight_version",
                                         json=_Calls.version_body(version, model, retired)))
