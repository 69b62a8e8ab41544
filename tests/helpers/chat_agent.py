"""A chat agent's loop through the capture proxy, and what it appends after each reply.

Shared by the early-send tests (test_capture_early.py) and the sampling-seed tests
(test_sampling_seeds.py): an agent with a long system prompt that calls `bash` every turn, its
messages growing as a real agent's do.
"""

from __future__ import annotations

import random

import httpx
import orjson

from tests.helpers.tools import BASH_TOOLS as TOOLS

__all__ = ["SYSTEM", "TOOLS", "agent_loop", "post", "step", "stream"]

SYSTEM = {"role": "system", "content": "You are a coding agent. " * 40}


def step(turn: int, rng: random.Random) -> list[dict]:
    """What an agent appends after a reply: its assistant message (sometimes in a shape the
    dialect rewrites) and a tool result."""
    arguments: object = '{"command": "ls"}'
    if rng.random() < 0.3:
        arguments = {"command": f"ls {turn}"}  # an object: the dialect writes it as a string
    call = {"id": f"call_{turn}", "type": "function",
            "function": {"name": "bash", "arguments": arguments}}
    added = [{"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"out {turn} " * 20}]
    if rng.random() < 0.2:
        added.append({"role": "developer", "content": "keep going"})  # becomes system
    return added


def post(info, messages: list[dict], **extra) -> httpx.Response:
    return httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "messages": messages, "tools": TOOLS, **extra})


def stream(info, messages: list[dict]) -> dict:
    """A streamed call; returns the assistant message the chunks add up to."""
    with httpx.stream("POST", f"{info.base_urls['chat']}/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {info.secret}"},
                      json={"model": "m", "messages": messages, "tools": TOOLS,
                            "stream": True}) as reply:
        assert reply.status_code == 200
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    calls = [call for line in lines[:-1] for choice in orjson.loads(line).get("choices", [])
             for call in (choice.get("delta") or {}).get("tool_calls") or []]
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": c["function"]} for c in calls]}


def agent_loop(info, turns: int, streamed: bool = False) -> list[dict]:
    messages = [SYSTEM, {"role": "user", "content": "fix the bug"}]
    for turn in range(turns):
        if streamed:
            message = stream(info, messages)
        else:
            reply = post(info, messages)
            assert reply.status_code == 200, reply.text
            message = reply.json()["choices"][0]["message"]
        messages = messages + [
            {k: message[k] for k in ("role", "content", "tool_calls") if k in message},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": f"out {turn}"}]
    return messages
