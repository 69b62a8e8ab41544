"""A fast fake of vLLM's chat-completions server, for fault injection and the benchmark.

Not a model: it answers any chat request with a deterministic reply, but with vLLM 0.32's wire
shape exactly as the capture proxy consumes it (top-level `prompt_token_ids`, per-choice and
per-chunk `token_ids`, logprob entries reading `token_id:N`, a usage chunk, `data: [DONE]`), and
with the property the rollout graph relies on: the prompt ids of a conversation extend the previous
prompt plus its completion whenever the agent sends the history back unchanged.

Its "tokenizer" is 4 bytes of the rendered conversation per id, each message rendered as
`<|role|>` + text (+ `<tool_call>name:args</tool_call>` per call) + `<|end|>`, every part padded to
4 bytes; so a 31 KB agent request is ~7.5k ids, as with a real BPE model. Each 4-byte group is
folded to an id below 32768 (its two halves XORed), so ids print with ~5 digits like a real
vocabulary's and the JSON the proxy reads is the size a real engine's would be.

Faults (set `FakeEngine.fault`, e.g. from a test, while it serves):

    None                    normal replies
    "http500"               HTTP 500 with an OpenAI error body
    "hang"                  never answers (the proxy's timeout must fire)
    "disconnect:K"          streaming: K chunks, then the connection is dropped; non-streaming: drop
    "no_token_ids"          a 200 reply without prompt_token_ids / token_ids
    "bad_logprob_pairing"   logprob entries name the wrong token ids
    "negative_ids"          sampled ids that are negative: ids, but not token ids

It refuses to be a benchmark of anything but the proxy: it does almost no work per request.
Run standalone: `python -m capture.fake_engine --port 8400 [--token-delay-ms 5]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from array import array
from typing import Any

import orjson

from .serving import ThreadedUvicorn, read_body
from .upstream import dumps, loads

__all__ = ["FakeEngine", "answer_lifespan", "check_chat_request", "render", "send_json"]

MODEL = "fake"


def _pad(text: str) -> bytes:
    data = text.encode("utf-8", "replace")
    return data + b" " * (-len(data) % 4)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)
                       and isinstance(p.get("text"), str))
    return ""


def _message_bytes(message: dict[str, Any]) -> bytes:
    body = _text(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function", {}) if isinstance(call, dict) else {}
            body += f"<tool_call>{function.get('name')}:{function.get('arguments')}</tool_call>"
    role = message.get("role", "user")
    return _pad(f"<|{role}|>") + _pad(body) + _pad("<|end|>")


def _ids(data: bytes) -> array:
    """One id per 4 bytes: the group's two 16-bit halves XORed (C-speed via big-int XOR)."""
    lo, hi = bytearray(len(data) // 2), bytearray(len(data) // 2)
    lo[0::2], lo[1::2], hi[0::2], hi[1::2] = data[0::4], data[1::4], data[2::4], data[3::4]
    folded = int.from_bytes(lo, "little") ^ int.from_bytes(hi, "little")
    ids = array("H")
    ids.frombytes(folded.to_bytes(len(lo), "little"))
    return ids


def render(body: dict[str, Any]) -> array:
    """Prompt ids of a chat request (tools rendered into the first message's position)."""
    parts = []
    tools = body.get("tools")
    if tools:
        parts.append(_pad("<|tools|>") + _pad(orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)
                                              .decode()) + _pad("<|end|>"))
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            parts.append(_message_bytes(message))
    parts.append(_pad("<|assistant|>"))
    return _ids(b"".join(parts))


class FakeEngine:
    """The fake as an ASGI app, plus start/stop on a background thread."""

    def __init__(self, *, reply_tokens: int = 24, token_delay_s: float = 0.0,
                 tool_calls: bool = True, host: str = "127.0.0.1", port: int = 0) -> None:
        self.reply_tokens = reply_tokens
        self.token_delay_s = token_delay_s
        self.tool_calls = tool_calls
        self.fault: str | None = None
        self.requests: list[dict[str, Any]] = []  # last bodies seen (bounded), for tests
        self.calls = 0  # chat requests served or failed, all of them (the bench's share per engine)
        self._runner = ThreadedUvicorn(self, host, port)
        self.url = ""

    def start(self) -> FakeEngine:
        port = self._runner.start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        self._runner.stop()

    def __enter__(self) -> FakeEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the reply ----------------------------------------------------------------------------
    def _reply(self, body: dict[str, Any]) -> tuple[dict[str, Any], array]:
        """The assistant message and its completion ids (which end with the `<|end|>` ids)."""
        turn = sum(1 for m in body.get("messages") or [] if isinstance(m, dict)
                   and m.get("role") == "assistant")
        if self.tool_calls and body.get("tools"):
            name = body["tools"][0].get("function", {}).get("name", "bash")
            arguments = json.dumps({"command": f"echo step {turn}"})
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{turn}", "type": "function",
                 "function": {"name": name, "arguments": arguments}}]}
        else:
            words = " ".join(f"w{i % 10:02d}" for i in range(self.reply_tokens))
            message = {"role": "assistant", "content": f"t{turn:02d} {words}"}
        completion = _ids(_message_bytes(message)[len(_pad("<|assistant|>")):])
        return message, completion

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        if scope["path"].endswith("/models"):
            await send_json(send, 200, {"object": "list", "data": [{"id": MODEL}]})
            return
        if scope["path"] == "/health":
            await send_json(send, 200, {})
            return
        raw = await read_body(receive)
        try:
            body = loads(raw)
            check_chat_request(body)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # vLLM answers a request it cannot parse with 400; so does the fake.
            await send_json(send, 400, {"error": {"message": f"fake engine: {exc}", "code": 400}})
            return
        self.requests = [*self.requests[-49:], body]
        self.calls += 1
        fault = self.fault
        if fault == "http500":
            await send_json(send, 500, {"error": {"message": "fake engine failure", "code": 500}})
            return
        if fault == "hang":
            await asyncio.sleep(3600)
            return
        prompt = render(body)
        message, completion = self._reply(body)
        if fault == "negative_ids":
            completion = array("i", [-1 - token for token in completion])
        logprobs = [-0.25 - (token % 7) / 10 for token in completion]
        if fault == "bad_logprob_pairing":
            entries = [{"token": f"token_id:{t + 1}", "logprob": lp}
                       for t, lp in zip(completion, logprobs, strict=True)]
        else:
            entries = [{"token": f"token_id:{t}", "logprob": lp}
                       for t, lp in zip(completion, logprobs, strict=True)]
        with_ids = fault != "no_token_ids"
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        cap = body.get("max_tokens")
        if isinstance(cap, int) and 0 < cap < len(completion):  # as vLLM: cut, "length"
            completion, entries, finish = completion[:cap], entries[:cap], "length"
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(completion),
                 "total_tokens": len(prompt) + len(completion)}
        if not body.get("stream"):
            if self.token_delay_s:  # a whole reply takes as long as its tokens would stream
                await asyncio.sleep(self.token_delay_s * len(completion))
            if fault and fault.startswith("disconnect"):
                raise ConnectionAbortedError("fake engine drops the connection")
            choice = {"index": 0, "message": message, "finish_reason": finish,
                      "logprobs": {"content": entries}}
            reply = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
                     "model": MODEL, "choices": [choice], "usage": usage}
            if with_ids:
                choice["token_ids"] = completion.tolist()
                reply["prompt_token_ids"] = prompt.tolist()
            await send_json(send, 200, reply)
            return
        await self._stream(send, body, prompt, message, completion, entries, usage, finish,
                           with_ids, fault)

    async def _stream(self, send: Any, body: dict[str, Any], prompt: array,
                      message: dict[str, Any], completion: array, entries: list[dict[str, Any]],
                      usage: dict[str, Any], finish: str, with_ids: bool, fault: str | None) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        drop_after = int(fault.split(":")[1]) if fault and fault.startswith("disconnect") else -1
        base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                "created": int(time.time()), "model": MODEL}
        first: dict[str, Any] = {**base, "choices": [
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
             "finish_reason": None}]}
        if with_ids:
            first["prompt_token_ids"] = prompt.tolist()
        chunks = [first]
        text = message.get("content") or ""
        calls = message.get("tool_calls")
        n_text = len(completion) - 2  # the last two ids are `<|end|>`
        for i, token in enumerate(completion):
            delta: dict[str, Any] = {}
            if i < n_text and not calls:
                delta["content"] = text[4 * i: 4 * i + 4]
            elif calls and i == 0:
                delta["tool_calls"] = [{"index": 0, **calls[0]}]
            choice: dict[str, Any] = {"index": 0, "delta": delta,
                                      "logprobs": {"content": [entries[i]]}, "finish_reason": None}
            if with_ids:
                choice["token_ids"] = [token]
            if i == len(completion) - 1:
                choice["finish_reason"] = finish
            chunks.append({**base, "choices": [choice]})
        chunks.append({**base, "choices": [], "usage": usage})
        for n, chunk in enumerate(chunks):
            if n == drop_after:
                raise ConnectionAbortedError("fake engine drops the stream")
            await send({"type": "http.response.body", "body": b"data: " + dumps(chunk) + b"\n\n",
                        "more_body": True})
            if self.token_delay_s and n:
                await asyncio.sleep(self.token_delay_s)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def answer_lifespan(receive: Any, send: Any) -> None:
    """The ASGI lifespan protocol for an app with nothing to start or stop."""
    while True:
        event = await receive()
        if event["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        else:
            await send({"type": "lifespan.shutdown.complete"})
            return


def check_chat_request(body: Any) -> None:
    """The little validation vLLM's pydantic request model would do, for what the fake reads."""
    if not isinstance(body, dict):
        raise TypeError("body must be an object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list")
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError("each message must be an object with a string role")
        calls = message.get("tool_calls")
        if calls is not None and (not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function", {}), dict) for c in calls)):
            raise ValueError("tool_calls must be a list of objects")
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) for t in tools)):
        raise ValueError("tools must be a list of function tools")


async def send_json(send: Any, status: int, body: dict[str, Any]) -> None:
    data = dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m capture.fake_engine")
    parser.add_argument("--port", type=int, default=8400)
    parser.add_argument("--token-delay-ms", type=float, default=0.0)
    parser.add_argument("--reply-tokens", type=int, default=24)
    args = parser.parse_args()
    engine = FakeEngine(reply_tokens=args.reply_tokens, token_delay_s=args.token_delay_ms / 1000,
                        port=args.port).start()
    print(f"fake engine on {engine.url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        engine.stop()


if __name__ == "__main__":
    main()
