"""`ProxyLink`: a session's one door to the capture proxy's admin API, errors translated here.

It speaks the admin routes of the cross-room contract (DESIGN.md section 2) with httpx:

    POST   /admin/sessions            {"sampling", "metadata"} -> {"session_id", "secret",
                                                                    "base_urls"}
    GET    /admin/sessions/{id}/trace  TrainingTrace JSON, or 409 {"reasons": [...]}
    GET    /admin/sessions/{id}/stats  {"n_calls", ...}
    DELETE /admin/sessions/{id}

Why not `capture.client.AsyncCaptureClient`: an httpx AsyncClient belongs to the event loop it
first ran on, and sessions driven through the sync API each have their own loop; this link keeps
one client per loop and closes it with the session, and maps every failure to the class the
metrics count, in one place:

    connection refused / timeout / 5xx   -> ProxyUnreachableError (retryable)
    404 on a session route               -> ProxySessionLostError (deleted or proxy restarted)
    409 on the trace                     -> capture.errors.NothingTrainableError (with reasons)
    401                                  -> InfraError naming the admin-key fix

With no proxy URL it starts an in-process `capture.server.CaptureServer` on the engine URL and
stops it in `close()`. It never retries: retry policy is the factory's.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import httpx
from openenv.core.harness.training import TrainingTrace

from harness.shared.errors import InfraError, ProxySessionLostError, ProxyUnreachableError
from harness.shared.per_loop import PerLoop

__all__ = ["ADMIN_KEY_ENV", "ProxyLink", "ProxySession"]

ADMIN_KEY_ENV = "HARNESS_CAPTURE_ADMIN_KEY"
_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


@dataclass(frozen=True)
class ProxySession:
    """What `create_session` returns: id, secret (the agent's API key), base URL per dialect."""

    session_id: str
    secret: str
    base_urls: dict[str, str]


class ProxyLink:
    def __init__(self, url: str, admin_key: str, *, server: Any = None) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key
        self._server = server
        # Where agents reach the proxy (its agent listener): never `url`, which may be the admin
        # listener (a proxy on a public address serves admin routes on their own loopback port).
        self._agent_url: str | None = server.url if server is not None else None
        self._clients = PerLoop(self._new_client, usable=lambda c: not c.is_closed)

    @classmethod
    def connect(
        cls, proxy_url: str | None, *, admin_key: str | None = None, engine_url: str | None = None
    ) -> ProxyLink:
        """Link to a running proxy, or start one in-process on `engine_url`."""
        if proxy_url is not None:
            key = admin_key or os.environ.get(ADMIN_KEY_ENV)
            if not key:
                raise ValueError(
                    f"capture proxy {proxy_url} needs its admin key: pass admin_key= or set "
                    f"${ADMIN_KEY_ENV} (python -m capture prints it / --admin-key-file sets it)"
                )
            return cls(proxy_url, key)
        if engine_url is None:
            raise ValueError("ProxyLink.connect needs proxy_url or engine_url")
        from capture.server import CaptureServer

        server = CaptureServer(engine_url, admin_key=admin_key)
        server.start()
        return cls(server.admin_url, server.admin_key, server=server)

    # ---- admin calls -----------------------------------------------------------------------------

    async def create_session(
        self, *, sampling: dict[str, Any] | None, metadata: dict[str, Any] | None,
        step_limit: int | None = None, caps: dict[str, int | None] | None = None,
    ) -> ProxySession:
        """`step_limit`: model calls that offer tools the proxy serves (None: no limit);
        `caps`: the rollout's caps on every call (capture.caps; None: none)."""
        body = await self._request(
            "POST", "/admin/sessions",
            json={"sampling": sampling or None, "metadata": metadata, "step_limit": step_limit,
                  "caps": caps},
        )
        return ProxySession(body["session_id"], body["secret"], dict(body["base_urls"]))

    async def training_trace(self, session_id: str) -> TrainingTrace:
        body = await self._request(
            "GET", f"/admin/sessions/{session_id}/trace", session_id=session_id
        )
        return TrainingTrace.model_validate(body)

    async def stats(self, session_id: str) -> dict[str, Any]:
        return await self._request(
            "GET", f"/admin/sessions/{session_id}/stats", session_id=session_id
        )

    async def model_calls(self, session_id: str) -> tuple[int, int]:
        """(engine calls the agent made in this session, failed ones included; calls refused
        past its step limit or its rollout caps, capture.caps)."""
        stats = await self.stats(session_id)
        refused = ((stats.get("steps") or {}).get("refused", 0)
                   + (stats.get("caps") or {}).get("refused", 0))
        return int(stats.get("n_calls", stats.get("n_ok", 0))), int(refused)

    async def agent_url(self) -> str:
        """The URL a sandbox is given a way to (forwarded to): the proxy's agent listener, asked
        of the proxy once (`GET /admin/agent_url`), never its admin listener."""
        if self._agent_url is None:
            body = await self._request("GET", "/admin/agent_url")
            self._agent_url = str(body["url"]).rstrip("/")
        return self._agent_url

    async def delete_session(self, session_id: str) -> None:
        with contextlib.suppress(ProxySessionLostError):  # already gone: the goal of a delete
            await self._request("DELETE", f"/admin/sessions/{session_id}", session_id=session_id)

    # ---- lifetime --------------------------------------------------------------------------------

    async def release_loop(self) -> None:
        """Close the httpx client of the running loop (a session's private loop is ending)."""
        client = self._clients.pop()
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Stop the in-process proxy, if this link started one."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    # ---- one boundary for every failure ----------------------------------------------------------

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=_TIMEOUT,
            trust_env=False,  # never route loopback admin calls through a host proxy
        )

    async def _request(
        self, method: str, path: str, *, session_id: str | None = None, **kwargs: Any
    ) -> Any:
        try:
            response = await self._clients.get().request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ProxyUnreachableError(
                f"capture proxy {self.url} unreachable ({type(exc).__name__}: {exc}); is it "
                "running? (python -m capture --engine-url ...)"
            ) from exc
        if response.status_code < 300:
            return response.json()
        detail = _error_detail(response)
        if response.status_code == 401:
            raise InfraError(
                f"capture proxy {self.url} rejected the admin key: {detail}. Pass the key it "
                f"printed at start (admin_key= or ${ADMIN_KEY_ENV})."
            )
        if response.status_code == 404 and session_id is not None:
            raise ProxySessionLostError(
                f"capture proxy {self.url} no longer knows session {session_id} (deleted, or the "
                f"proxy restarted without its data dir): {detail}"
            )
        if response.status_code == 409 and session_id is not None:
            from capture.errors import NothingTrainableError

            reasons = response.json().get("reasons") or [detail]
            raise NothingTrainableError(session_id, list(reasons))
        if response.status_code >= 500:
            raise ProxyUnreachableError(
                f"capture proxy {self.url} failed on {method} {path}: HTTP "
                f"{response.status_code}: {detail}"
            )
        raise InfraError(f"capture proxy {method} {path}: HTTP {response.status_code}: {detail}")


def _error_detail(response: httpx.Response) -> str:
    try:
        error = response.json().get("error") or {}
        return str(error.get("message") or response.text)[:500]
    except ValueError:
        return response.text[:500]
