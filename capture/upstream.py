"""The engine leg: one pooled HTTP client to vLLM's OpenAI chat-completions route.

Every call is sent as a chat completion, whatever dialect the agent spoke, with the fields that
make it capturable:

    logprobs: true, top_logprobs: 0   vLLM fills `choices[0].logprobs.content` only when
                                      `top_logprobs` is not None; 0 returns just the sampled
                                      token's logprob, all training needs
    return_token_ids: true            top-level `prompt_token_ids` (first chunk when streaming)
                                      and `choices[0].token_ids` (per chunk: the delta ids)
    stream_options.include_usage      a final usage chunk, so streamed calls carry usage too

Logprob entries read `token_id:N` because the engine runs with --return-tokens-as-token-ids, which
lets the recorder check the id/logprob pairing at every position.

Decisions:
  * One `httpx.AsyncClient` for the whole proxy (shared connection pool, keep-alive): a new
    connection per call costs more than the rest of the proxy's work on a small request.
  * Streaming is passed through as it arrives: `stream()` yields each parsed chunk the moment its
    SSE event is complete; nothing waits for the whole reply (OpenEnv 0.10's proxy did, so its time
    to first byte equalled the generation time: 741 ms against 9 ms direct at 5 ms/token).
  * httpx errors never leave this module: they become capture.errors.UpstreamError subclasses.

What it does not do: retry. A retry would re-sample; the agent (or its SDK) decides whether to
retry, and each attempt is then a recorded call of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from .errors import (
    EngineDisconnected,
    EngineHTTPError,
    EngineTimeout,
    EngineUnreachable,
)

__all__ = ["EngineClient", "dumps", "loads"]

try:  # orjson is ~5x faster on the large id arrays; json is the always-present fallback
    import orjson

    def loads(data: bytes | str) -> Any:
        return orjson.loads(data)

    def dumps(obj: Any) -> bytes:
        try:
            return orjson.dumps(obj)
        except TypeError:  # ints beyond 64 bits, odd keys: the slow path takes them
            return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str).encode()

    JSON_ERRORS: tuple[type[Exception], ...] = (orjson.JSONDecodeError, RecursionError)
except ImportError:  # pragma: no cover - depends on the environment
    _encoder = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))

    def loads(data: bytes | str) -> Any:
        return json.loads(data)

    def dumps(obj: Any) -> bytes:
        return _encoder.encode(obj).encode()

    JSON_ERRORS = (ValueError, RecursionError)


class EngineClient:
    """Async client to one engine. `complete()` for whole replies, `stream()` for SSE."""

    def __init__(
        self,
        engine_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 512,
    ) -> None:
        base = engine_url.rstrip("/")
        self.engine_url = base[:-3] if base.endswith("/v1") else base
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(
            base_url=self.engine_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            headers={"content-type": "application/json"},
        )
        self._model: str | None = None

    async def aclose(self) -> None:
        await self._client.aclose()

    async def served_model(self) -> str:
        """The engine's served model name (asked once, then cached)."""
        if self._model is None:
            reply = await self._request("GET", "/v1/models")
            try:
                self._model = str(reply["data"][0]["id"])
            except (KeyError, IndexError, TypeError) as exc:
                raise EngineHTTPError(200, f"/v1/models answered without a model: {reply}") from exc
        return self._model

    async def complete(self, chat: dict[str, Any]) -> dict[str, Any]:
        """Send a non-streaming chat completion; return the parsed reply."""
        return await self._request("POST", "/v1/chat/completions", dumps(chat))

    async def _request(self, method: str, path: str, body: bytes | None = None) -> Any:
        try:
            response = await self._client.request(method, path, content=body)
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"engine at {self.engine_url} timed out ({exc!r})") from exc
        except (httpx.TransportError, OSError) as exc:
            raise EngineUnreachable(f"engine at {self.engine_url} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            raise EngineHTTPError(response.status_code, _error_body(response.content))
        try:
            reply = loads(response.content)
        except JSON_ERRORS as exc:
            raise EngineHTTPError(200, f"engine sent invalid JSON: {exc}") from exc
        if not isinstance(reply, dict):
            raise EngineHTTPError(200, "engine sent a JSON value that is not an object")
        return reply

    async def open_stream(self, chat: dict[str, Any]) -> EngineStream:
        """Start a streaming chat completion; raises before any byte reaches the agent on error."""
        request = self._client.build_request("POST", "/v1/chat/completions", content=dumps(chat))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"engine at {self.engine_url} timed out ({exc!r})") from exc
        except (httpx.TransportError, OSError) as exc:
            raise EngineUnreachable(f"engine at {self.engine_url} unreachable: {exc!r}") from exc
        if response.status_code != 200:
            try:
                content = await response.aread()
            except (httpx.HTTPError, OSError):
                content = b""
            finally:
                await response.aclose()
            raise EngineHTTPError(response.status_code, _error_body(content))
        return EngineStream(response, self.engine_url)


class EngineStream:
    """One open SSE reply. Iterate `chunks()`; always `aclose()` (the route does, in `finally`)."""

    def __init__(self, response: httpx.Response, engine_url: str) -> None:
        self._response = response
        self._engine_url = engine_url

    async def chunks(self) -> AsyncIterator[dict[str, Any]]:
        """Parsed `chat.completion.chunk`s as they arrive; returns at `[DONE]`.

        Raises EngineDisconnected if the stream ends without `[DONE]`, EngineTimeout if the engine
        goes quiet, EngineHTTPError if it sends an error event.
        """
        buffer = b""
        try:
            async for raw in self._response.aiter_raw():
                buffer += raw
                while True:
                    cut = buffer.find(b"\n")
                    if cut < 0:
                        break
                    line, buffer = buffer[:cut].rstrip(b"\r"), buffer[cut + 1 :]
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, `event:` lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        return
                    try:
                        chunk = loads(data)
                    except JSON_ERRORS as exc:
                        raise EngineHTTPError(200, f"engine sent a malformed SSE event: {exc}") from exc
                    if not isinstance(chunk, dict):
                        raise EngineHTTPError(200, "engine sent an SSE event that is not an object")
                    if "error" in chunk and "choices" not in chunk:
                        raise EngineHTTPError(500, chunk)
                    yield chunk
        except httpx.TimeoutException as exc:
            raise EngineTimeout(f"engine at {self._engine_url} stopped streaming: {exc!r}") from exc
        except (httpx.TransportError, OSError) as exc:
            raise EngineDisconnected(f"engine stream broke: {exc!r}") from exc
        raise EngineDisconnected("engine stream ended before [DONE]: the reply is incomplete")

    async def aclose(self) -> None:
        # Closing a broken stream must not mask the error that broke it.
        with contextlib.suppress(httpx.HTTPError, OSError):
            await self._response.aclose()


def _error_body(content: bytes) -> Any:
    try:
        return loads(content)
    except JSON_ERRORS:
        return content[:1000].decode("utf-8", "replace")

