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
  * One aiohttp ClientSession with one keep-alive connection pool for the whole proxy, made on the
    serving loop at its first call and closed by the app's lifespan (`aclose`). aiohttp, a
    maintained client, rather than a hand-written one: a library upgrade must not be able to break
    the engine leg; the cost, ~0.5 ms of CPU per call against a bare httptools client on this
    machine, is measured in bench/capture. Not httpx: measured here with a 31 KB request and a
    7.5k-id reply, its AsyncClient cost 4.8 ms of CPU per request at 1-8 concurrent and 12.7 ms
    at 64 (its pool scans every connection per request).
  * Tuned for one plain engine: `keepalive_timeout` 4 s, under the 5 s after which vLLM's uvicorn
    closes an idle connection (so a request is rarely written to a connection the engine is
    closing; aiohttp does not resend a POST, and neither does this: a resend could re-sample);
    no cookies, no environment proxies, URLs parsed once. `timeout_s` is the longest the engine
    may stay silent while a reply is owed: a whole reply's total time (the engine sends nothing
    before it is done), a stream's time before its head or between two pieces of it;
    `connect_timeout_s` the longest a connection may take.
  * Streaming is passed through as it arrives: `batches()` yields each parsed chunk the moment
    its SSE event is complete; nothing waits for the whole reply (OpenEnv 0.10's proxy did, so its
    time to first byte equalled the generation time: 741 ms against 9 ms direct at 5 ms/token).
    A slow consumer pauses the socket (aiohttp's stream reader stops reading past its buffer
    limit), so a slow agent never makes the proxy buffer a stream.
  * Socket, protocol and timeout errors never leave this module: `_translate` maps them to
    capture.errors.UpstreamError subclasses, in one place.

What it does not do: retry. A retry would re-sample; the agent (or its SDK) decides whether to
retry, and each attempt is then a recorded call of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from yarl import URL

from .busy import BusyClock
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

    One aiohttp session (its connection pool), made on the proxy's event loop at first use and
    closed by the app's lifespan (`aclose`).
    """

    def __init__(
        self,
        engine_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        max_connections: int = 512,
        api_key: str | None = None,
    ) -> None:
        """`api_key`: the engine's key (vLLM --api-key), sent on every call; default:
        $HARNESS_ENGINE_API_KEY (launchers.engine starts the engine with it), none if unset."""
        key = api_key if api_key is not None else os.environ.get(ENGINE_KEY_ENV)
        self._headers = {"authorization": f"Bearer {key}"} if key else None
        base = engine_url.rstrip("/")
        self.engine_url = base[:-3] if base.endswith("/v1") else base
        parts = urlsplit(self.engine_url)
        # Checked here, so a URL the client cannot speak fails at start-up, not at the first call.
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"engine URL {engine_url!r} must be http://host[:port][/prefix] or "
                             "https://...")
        self.timeout_s = timeout_s
        # A whole reply: the engine is silent until it is done, so its silence is its total time,
        # one timer per call. A stream: its head within `timeout_s`, then `EngineStream`'s own
        # watchdog for the silence between two pieces (aiohttp's `sock_read` would move a timer
        # on every read, ~10% of a streamed call's CPU here).
        self._whole = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self._stream = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s)
        self._max_connections = max_connections
        # URL objects made once: aiohttp parses a str URL (and derives its Host) on every call
        self._chat_url = URL(f"{self.engine_url}/v1/chat/completions")
        self._models_url = URL(f"{self.engine_url}/v1/models")
        self._health_url = URL(f"{self.engine_url}/health")
        self._http: aiohttp.ClientSession | None = None
        self._model: str | None = None
        # Told of every transport failure (refused, dropped, silent), translated: how an
        # EnginePool (capture.engines) hears that an engine may be gone. None: nobody listens.
        self.on_failure: Callable[[EngineClient, UpstreamError], None] | None = None
        # Chat completions in flight and the time with at least one (capture.busy): the
        # engine-busy fraction a run reports.
        self.busy = BusyClock()

    def _failed(self, exc: BaseException) -> UpstreamError:
        """`exc` translated (the one mapping, `_translate`), after telling `on_failure`."""
        translated = _translate(exc, self.engine_url)
        self.failed(translated)
        return translated

    def failed(self, error: UpstreamError) -> None:
        if self.on_failure is not None:
            self.on_failure(self, error)

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, keepalive_timeout=4.0,
                ttl_dns_cache=300)
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=self._stream, headers=self._headers,
                cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether the engine answers GET /health with 200 within `timeout_s` (vLLM's liveness
        route; the fake engines serve it too). Never raises."""
        try:
            async with self._session().get(
                    self._health_url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
                await response.read()
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    async def served_model(self) -> str:
        """The engine's served model name (asked once, then cached)."""
        if self._model is None:
            reply = _parse_object(await self._read("GET", self._models_url))
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
        return _parse_reply(await self.complete_raw(body))

    async def complete_raw(self, body: bytes) -> bytes:
        """A non-streaming chat completion's reply bytes, unparsed (the bench's bare relay)."""
        self.busy.begin()
        try:
            return await self._read("POST", self._chat_url, body)
        finally:
            self.busy.end()

    async def _read(self, method: str, url: URL, body: bytes | None = None) -> bytes:
        """A whole reply's body; a non-200 status is an EngineHTTPError."""
        try:
            async with self._session().request(method, url, data=body, timeout=self._whole,
                                               headers=_JSON if body else None) as response:
                content = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._failed(exc) from exc
        if status != 200:
            raise EngineHTTPError(status, _error_body(content))
        return content

    async def open_stream(self, chat: dict[str, Any] | bytes) -> EngineStream:
        """Start a streaming chat completion (a dict, or its JSON already written); raises before
        any byte reaches the agent on error."""
        body = chat if isinstance(chat, bytes) else dumps(chat)
        self.busy.begin()  # ended by the stream's release(), or below if there is no stream
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._session().post(self._chat_url, data=body, headers=_JSON)
        except BaseException as exc:
            self.busy.end()
            if isinstance(exc, TimeoutError | aiohttp.ClientError | OSError):
                raise self._failed(exc) from exc
            raise
        if response.status != 200:
            self.busy.end()
            try:
                content = await response.read()
            except (TimeoutError, aiohttp.ClientError, OSError):
                content = b""
            finally:
                response.release()
            raise EngineHTTPError(response.status, _error_body(content))
        return EngineStream(response, self.engine_url, self.timeout_s, self)


# The engine's API key, as launchers.engine starts it (launchers.engine.API_KEY_ENV).
ENGINE_KEY_ENV = "HARNESS_ENGINE_API_KEY"
_JSON = {"content-type": "application/json"}


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


def _translate(exc: BaseException, engine_url: str) -> UpstreamError:
    """The client's errors -> the capture tree (the one place they are mapped)."""
    if isinstance(exc, TimeoutError):  # aiohttp's read and connect timeouts are TimeoutErrors
        return EngineTimeout(f"engine at {engine_url} timed out ({exc!r})")
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, unresolvable, TLS refused
        return EngineUnreachable(f"engine at {engine_url} unreachable: {exc!r}")
    # dropped mid-request, reset, a reply cut short or not HTTP at all
    return EngineDisconnected(f"engine at {engine_url} dropped the connection: {exc!r}")


class EngineStream:
    """One open SSE reply. Iterate `batches()`; always `aclose()` (the route does)."""

    def __init__(self, response: aiohttp.ClientResponse, engine_url: str,
                 timeout_s: float = 600.0, client: EngineClient | None = None) -> None:
        self._response = response
        self._client = client  # told of a stream that breaks (EngineClient.failed)
        self._engine_url = engine_url
        self.prompt: IdText | None = None  # from the first event, cut out before parsing
        self._timeout_s = timeout_s
        self._waiting_since: float | None = None  # loop time a read began, while one is waited on
        self._silent = False
        self._watchdog: asyncio.TimerHandle | None = None
        self._busy = client.busy if client is not None else None  # ended once, at release

    def _watch(self, task: asyncio.Task[Any]) -> None:
        """The read timeout: one timer per stream that moves its own deadline. Only time spent
        waiting on the engine counts (a consumer that is slow to ask is not the engine's
        silence); past `timeout_s` of it the reading task is cancelled, and `batches` turns that
        into EngineTimeout."""
        loop = asyncio.get_running_loop()
        since = self._waiting_since
        if since is not None and loop.time() - since >= self._timeout_s:
            self._silent = True
            task.cancel()
            return
        deadline = (since if since is not None else loop.time()) + self._timeout_s
        self._watchdog = loop.call_at(deadline, self._watch, task)

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
        content = self._response.content
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        self._waiting_since = None
        self._watch(task)
        try:
            while True:
                self._waiting_since = loop.time()
                raw = await content.readany()
                self._waiting_since = None
                if not raw:
                    break
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
        except asyncio.CancelledError:
            if self._silent and task.uncancel() == 0:  # the watchdog's, no one else's
                silent = EngineTimeout(f"the engine at {self._engine_url} sent nothing for "
                                       f"{self._timeout_s:g} s mid-stream")
                if self._client is not None:
                    self._client.failed(silent)
                raise silent from None
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            translated = _translate(exc, self._engine_url)
            if isinstance(translated, EngineUnreachable):  # broke after it started: a disconnect
                translated = EngineDisconnected(f"engine stream broke: {exc!r}")
            if self._client is not None:
                self._client.failed(translated)
            raise translated from exc
        finally:
            self._waiting_since = None
            if self._watchdog is not None:
                self._watchdog.cancel()
        raise EngineDisconnected("engine stream ended before [DONE]: the reply is incomplete")

    async def aclose(self) -> None:
        self.release()

    def release(self) -> None:
        # A finished stream's connection goes back to the pool; an unfinished one is closed (its
        # remaining bytes are unknown, and closing it is how vLLM hears to stop generating).
        self._response.release()
        busy, self._busy = self._busy, None
        if busy is not None:
            busy.end()


def _error_body(content: bytes) -> Any:
    try:
        return loads(content)
    except JSON_ERRORS:
        return content[:1000].decode("utf-8", "replace")

