"""Fuzz: 1,200 malformed or hostile bodies across every agent route; zero 5xx, zero crashes.

Each body is a valid request of one dialect (chat, responses, messages, count_tokens) with one
to three random mutations (a value replaced by a hostile one, a key deleted, a type swapped), or
raw junk (truncated JSON, deep nesting, random bytes, a NaN, a lone surrogate, a wrong content
type). Some ask to stream, so the stream encoders are fuzzed too. The engine is the in-package
fake, which answers 400 where vLLM would. Seeded, so a failure replays.

Run: .venv/bin/python -m pytest tests/test_capture_fuzz.py -q
"""

from __future__ import annotations

import copy
import json
import random
import time

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from capture.fake_engine import FakeEngine

N_BODIES = 1200
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {
                                               "command": {"type": "string"}}}}}]
SEEDS = {
    "chat": {"model": "m", "max_tokens": 32, "tools": TOOLS, "messages": [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]},
    "responses": {"model": "m", "instructions": "You are Codex.", "max_output_tokens": 32,
                  "tools": [{"type": "function", "name": "shell", "parameters": {
                      "type": "object", "properties": {"cmd": {"type": "string"}}}}],
                  "input": [
                      {"type": "message", "role": "user",
                       "content": [{"type": "input_text", "text": "fix it"}]},
                      {"type": "function_call", "call_id": "c1", "name": "shell",
                       "arguments": "{\"cmd\": \"ls\"}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "a.py"}]},
    "messages": {"model": "m", "max_tokens": 32, "system": [{"type": "text", "text": "Claude."}],
                 "tools": [{"name": "Bash", "input_schema": {"type": "object"}}],
                 "messages": [
                     {"role": "user", "content": "fix it"},
                     {"role": "assistant", "content": [
                         {"type": "thinking", "thinking": "hmm", "signature": ""},
                         {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": "ls"}}]},
                     {"role": "user", "content": [
                         {"type": "tool_result", "tool_use_id": "t1", "content": "a.py"}]}]},
}
SEEDS["count_tokens"] = copy.deepcopy(SEEDS["messages"])
HOSTILE = [None, True, False, 0, -1, 2**63, 10**40, 1e308, -0.0, "", "x" * 20_000, "\u0000",
           "\u202e\U0001f600", [], {}, [None], [[[[[]]]]], {"role": "system"}, {"type": None},
           {"type": "image", "source": {"type": "base64", "data": "@@"}}, "assistant", "tool",
           {"type": "function", "function": None}, [{"type": "text"}], -5, 3.5, "stream"]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))


def _mutate(body, rng: random.Random):
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(body) if p]
        if not paths:
            break
        path = rng.choice(paths)
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        action = rng.random()
        if action < 0.25 and isinstance(parent, dict):
            del parent[path[-1]]
        elif action < 0.35 and isinstance(parent, list):
            parent.append(copy.deepcopy(rng.choice(HOSTILE)))
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(HOSTILE))
    if rng.random() < 0.3 and isinstance(body, dict):
        body["stream"] = True
    return body


def _raw(rng: random.Random) -> tuple[bytes, str]:
    """Bodies that are not (valid) JSON objects, or not JSON at all."""
    choice = rng.randrange(8)
    valid = json.dumps(SEEDS[rng.choice(list(SEEDS))]).encode()
    if choice == 0:
        return valid[: rng.randrange(1, len(valid))], "application/json"  # truncated
    if choice == 1:
        depth = rng.choice([100, 5000, 50_000])
        return b"[" * depth + b"]" * depth, "application/json"  # deep nesting
    if choice == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 500))), "application/json"
    if choice == 3:
        return b'{"model": "m", "max_tokens": NaN, "messages": []}', "application/json"
    if choice == 4:
        return b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "application/json"
    if choice == 5:
        return valid, rng.choice(["text/plain", "multipart/form-data", "application/xml"])
    if choice == 6:
        return b"\xef\xbb\xbf" + valid, "application/json"  # BOM
    return rng.choice([b"null", b"[]", b"42", b'"s"', b"{}", b""]), "application/json"


@pytest.fixture(scope="module")
def target():
    with FakeEngine() as fake, CaptureServer(fake.url, upstream_timeout_s=5) as proxy:
        admin = CaptureClient(proxy.url, proxy.admin_key)
        yield proxy, admin.create_session(sampling={"temperature": 1.0, "max_tokens": 32})


def _url(info, route: str) -> str:
    return {
        "chat": f"{info.base_urls['chat']}/chat/completions",
        "responses": f"{info.base_urls['responses']}/responses",
        "messages": f"{info.base_urls['messages']}/v1/messages",
        "count_tokens": f"{info.base_urls['messages']}/v1/messages/count_tokens",
    }[route]


def test_1200_hostile_bodies_get_no_5xx_and_do_not_crash_the_proxy(target):
    proxy, info = target
    rng = random.Random(20260311)
    statuses: dict[int, int] = {}
    server_errors: list[str] = []
    started = time.monotonic()
    with httpx.Client(timeout=30, headers={"x-api-key": info.secret,
                                           "authorization": f"Bearer {info.secret}"}) as http:
        for n in range(N_BODIES):
            route = rng.choice(list(SEEDS))
            if rng.random() < 0.25:
                content, ctype = _raw(rng)
            else:
                body = _mutate(SEEDS[route], rng)
                content = json.dumps(body, allow_nan=True).encode()
                ctype = "application/json"
            try:
                with http.stream("POST", _url(info, route), content=content,
                                 headers={"content-type": ctype}) as reply:
                    reply.read()  # a stream must end cleanly, not be cut off
                    status = reply.status_code
            except httpx.HTTPError as exc:
                server_errors.append(f"#{n} {route}: connection broke: {exc!r}")
                continue
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500:
                server_errors.append(f"#{n} {route} -> {status}: {content[:300]!r}")
    elapsed = time.monotonic() - started
    print(f"{N_BODIES} bodies in {elapsed:.1f}s, statuses {sorted(statuses.items())}")
    assert server_errors == [], "\n".join(server_errors[:20])
    assert sum(statuses.values()) == N_BODIES
    assert httpx.get(f"{proxy.url}/health").status_code == 200


def test_no_dialect_raises_anything_but_dialect_error_on_hostile_bodies(target):
    proxy, _ = target
    # Runs after the fuzz test above (same module-scoped proxy): the core counts every exception
    # other than DialectError that a dialect raised while translating a request.
    assert proxy.state.dialect_crashes == 0
