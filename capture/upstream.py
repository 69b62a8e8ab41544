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
  * One pool of keep-alive connections for the whole proxy, on the proxy's own small HTTP/1.1
    client (`engine_http.py`, httptools). Not httpx: measured here with a 31 KB request and a
    7.5k-id reply, httpx's AsyncClient cost 4.8 ms of CPU per request at 1-8 concurrent and
    12.7 ms at 64 (its pool scans every connection per request). Not aiohttp either, which cost
    ~0.6 ms per call more than the httptools client (`engine_http.py` says where it went).
  * Streaming is passed through as it arrives: `batches()` yields each parsed chunk the moment
    its SSE event is complete; nothing waits for the whole reply (OpenEnv 0.10's proxy did, so its
    time to first byte equalled the generation time: 741 ms against 9 ms direct at 5 ms/token).
  * Socket and timeout errors never leave this module: they become capture.errors.UpstreamError
    subclasses.

What it does not do: retry. A retry would re-sample; the agent (or its SDK) decides whether to
retry, and each attempt is then a recorded call of its own. (The one resend, in `engine_http.py`,
is of a request the engine closed its keep-alive connection on without reading: nothing sampled.)
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from .engine_http import EngineHTTP, EngineReply
from .errors import (
    EngineDisconnected,
    EngineHTTPError,
    EngineTimeout,
    EngineUnreachable,
    UpstreamError,
)
from .tokens import IdText, split_prompt_ids

__all__ = ["EngineClient", "EngineStream", "dumps", "loads"]

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
    """Async client to one engine. `complete()` for whole replies, `open_stream()` for SSE.

    One connection pool (`engine_http.EngineHTTP`), used from the proxy's event loop and closed by
    the app's lifespan.
    """

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
        # read_timeout_s: the longest the engine may stay silent (whole reply, or next chunk).
        # Made here so a URL it cannot speak fails at start-up; it binds to no loop until used.
        self._pool = EngineHTTP.for_url(self.engine_url, connect_timeout_s=connect_timeout_s,
                                        read_timeout_s=timeout_s, max_connections=max_connections)
        self._model: str | None = None

    async def aclose(self) -> None:
        await self._pool.aclose()

    async def served_model(self) -> str:
        """The engine's served model name (asked once, then cached)."""
        if self._model is None:
            reply = await self._request("GET", "/v1/models")
            try:
                self._model = str(reply["data"][0]["id"])
            except (KeyError, IndexError, TypeError) as exc:
                raise EngineHTTPError(200, f"/v1/models answered without a model: {reply}") from exc
        return self._model

    async def complete(self, chat: dict[str, Any] | bytes) -> tuple[dict[str, Any], IdText | None]:
        """Send a non-streaming chat completion (a dict, or its JSON already written); return the
        parsed reply and its prompt ids.

        The prompt ids are cut out of the raw reply before parsing (capture.tokens), so the reply's
        `prompt_token_ids` is None and the ids come back as text, unparsed.
        """
        body = chat if isinstance(chat, bytes) else dumps(chat)
        return await self._request("POST", "/v1/chat/completions", body, split=True)

    async def _request(self, method: str, path: str, body: bytes | None = None,
                       split: bool = False) -> Any:
        try:
            response = await self._pool.request(method, path, body, whole=True)
            content = await response.read()
            status = response.status
        except OSError as exc:  # TimeoutError and the connection errors are OSErrors
            raise _translate(exc, self.engine_url) from exc
        if status != 200:
            raise EngineHTTPError(status, _error_body(content))
        reply, prompt = _parse_reply(content) if split else (_parse_object(content), None)
        return (reply, prompt) if split else reply

    async def open_stream(self, chat: dict[str, Any] | bytes) -> EngineStream:
        """Start a streaming chat completion (a dict, or its JSON already written); raises before
        any byte reaches the agent on error."""
        body = chat if isinstance(chat, bytes) else dumps(chat)
        try:
            response = await self._pool.request("POST", "/v1/chat/completions", body)
        except OSError as exc:  # TimeoutError and the connection errors are OSErrors
            raise _translate(exc, self.engine_url) from exc
        if response.status != 200:
            try:
                content = await response.read()
            except OSError:
                content = b""
            finally:
                response.release()
            raise EngineHTTPError(response.status, _error_body(content))
        return EngineStream(response, self.engine_url)


def _parse_object(content: bytes) -> dict[str, Any]:
    try:
        reply = loads(content)
    except JSON_ERRORS as exc:
        raise EngineHTTPError(200, f"engine sent invalid JSON: {exc}") from exc
    if not isinstance(reply, dict):
        raise EngineHTTPError(200, "engine sent a JSON value that is not an object")
    return reply


def _parse_reply(content: bytes) -> tuple[dict[str, Any], IdText | None]:
    """Parse a reply (or chunk) with its top-level prompt ids kept as text (capture.tokens)."""
    stripped, prompt = split_prompt_ids(content)
    if prompt is None:
        return _parse_object(content), None
    reply = _parse_object(stripped)
    if reply.get("prompt_token_ids", 0) is not None:
        # The list that was cut was a nested one: read the reply the certain way.
        return _parse_object(content), None
    return reply, prompt


def _translate(exc: Exception, engine_url: str) -> UpstreamError:
    """Socket and timeout errors -> the capture tree (the one place they are mapped)."""
    if isinstance(exc, TimeoutError):  # before OSError: TimeoutError is one
        return EngineTimeout(f"engine at {engine_url} timed out ({exc!r})")
    if isinstance(exc, ConnectionResetError | ConnectionAbortedError | BrokenPipeError):
        return EngineDisconnected(f"engine at {engine_url} dropped the connection: {exc!r}")
    return EngineUnreachable(f"engine at {engine_url} unreachable: {exc!r}")


class EngineStream:
    """One open SSE reply. Iterate `batches()`; always `aclose()` (the route does)."""

    def __init__(self, response: EngineReply, engine_url: str) -> None:
        self._response = response
        self._engine_url = engine_url
        self.prompt: IdText | None = None  # from the first event, cut out before parsing

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        """Parsed `chat.completion.chunk`s, as many as each network read completed; ends at `[DONE]`.

        A batch is never held back waiting for more: it is whatever had arrived, so the agent gets
        each token as soon as the engine sends it, and when the engine is ahead of the proxy
        (several events in one read) they travel on as one write instead of one per token.

        Raises EngineDisconnected if the stream ends without `[DONE]`, EngineTimeout if the engine
        goes quiet, EngineHTTPError if it sends an error event. Lines are split here, on whatever
        arrived: vLLM's first chunk carries every prompt id on one line (~250 KB at 41k ids).
        """
        pending = b""
        # Closed here, not left for Python to finalise whenever it collects the generator: that
        # costs a task per stream, at a time nobody chose.
        pieces = self._response.iter_any()
        try:
            async for raw in pieces:
                lines = (pending + raw).split(b"\n") if pending else raw.split(b"\n")
                pending = lines.pop()
                batch: list[dict[str, Any]] = []
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue  # blank separators, comments, `event:` lines
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        if batch:
                            yield batch
                        return
                    if self.prompt is None and b'"prompt_token_ids"' in data:
                        chunk, self.prompt = _parse_reply(data)
                    else:
                        chunk = _parse_object(data)
                    if "error" in chunk and "choices" not in chunk:
                        if batch:
                            yield batch
                        raise EngineHTTPError(500, chunk)
                    batch.append(chunk)
                if batch:
                    yield batch
        except OSError as exc:  # TimeoutError and the connection errors are OSErrors
            translated = _translate(exc, self._engine_url)
            if isinstance(translated, EngineUnreachable):  # broke after it started: a disconnect
                translated = EngineDisconnected(f"engine stream broke: {exc!r}")
            raise translated from exc
        finally:
            await pieces.aclose()
        raise EngineDisconnected("engine stream ended before [DONE]: the reply is incomplete")

    async def aclose(self) -> None:
        self.release()

    def release(self) -> None:
        # Releasing a finished stream returns the connection to the pool; an unfinished one is
        # closed (its remaining bytes are unknown).
        self._response.release()


def _error_body(content: bytes) -> Any:
    try:
        return loads(content)
    except JSON_ERRORS:
        return content[:1000].decode("utf-8", "replace")

