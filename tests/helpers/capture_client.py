"""An agent's side of the capture proxy, for the capture tests: one chat call, an agent loop.

The session and durability tests drive a proxy (in front of capture.fake_engine) the way an
agent does: post the history with the session's key, append the reply and a tool result, post
again. `url` sends the call to another proxy (one restarted on the same data dir) under the same
session path, as an agent whose proxy moved would.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.helpers.tools import BASH_TOOLS

__all__ = ["SECRET", "chat", "conversation"]

SECRET = "<secret>"  # `key=SECRET`: the session's own secret


def chat(info: Any, messages: list[dict], url: str | None = None, *, key: str | None = SECRET,
         tools: list[dict] | None = BASH_TOOLS, **extra: Any) -> httpx.Response:
    """POST /chat/completions as the agent of session `info`: with its secret unless `key`
    names another (None: no authorization header), offering `tools` unless None."""
    base = info.base_urls["chat"] if url is None else f"{url}/s/{info.session_id}/v1"
    headers = {} if key is None else {
        "authorization": f"Bearer {info.secret if key == SECRET else key}"}
    body = {"model": "m", "messages": messages, **({"tools": tools} if tools else {}), **extra}
    return httpx.post(f"{base}/chat/completions", json=body, headers=headers, timeout=60)


def conversation(info: Any, turns: int, *, url: str | None = None,
                 messages: list[dict] | None = None) -> list[dict]:
    """An agent loop of `turns` calls, each appending the reply and a tool result to `messages`
    (extended in place; a short system and user turn when None); returns the history."""
    if messages is None:
        messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "fix"}]
    start = sum(1 for m in messages if m["role"] == "tool")
    for turn in range(start, start + turns):
        reply = chat(info, messages, url=url)
        assert reply.status_code == 200, reply.text
        message = reply.json()["choices"][0]["message"]
        messages += [{k: message[k] for k in ("role", "content", "tool_calls") if k in message},
                     {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"out {turn}"}]
    return messages
