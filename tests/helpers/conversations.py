"""Synthetic agent request histories, one body per turn, each resending the whole history.

The translation memo (tests/test_dialects_memo.py) and the capture's resent-history handling
(tests/test_capture_resent.py) are both about what a growing, resent history costs and keeps;
they need the same histories: a chat agent's (tool calls with object or string arguments) and
Claude Code's Messages shape (thinking, two tool_use blocks, tool_result blocks out of order).
"""

from __future__ import annotations

import copy
import json
import random

__all__ = ["chat_turns", "messages_turns"]


def chat_turns(n: int, seed: int = 0) -> list[dict]:
    """A chat agent's n requests: each resends the history plus a tool call and its result."""
    rng = random.Random(seed)
    messages: list[dict] = [{"role": "developer", "content": "you are an agent " * 50},
                            {"role": "user", "content": "fix it"}]
    bodies = []
    for turn in range(n):
        bodies.append({"model": "m", "messages": copy.deepcopy(messages), "tools": [
            {"type": "function", "function": {"name": "bash", "parameters": {}}}]})
        arguments = {"command": f"ls {turn}"} if rng.random() < 0.5 else json.dumps(
            {"command": f"cat {turn}"})  # object arguments are normalised to a JSON string
        messages += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{turn}", "type": "function",
             "function": {"name": "bash", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": f"out {turn}"}]
    return bodies


def messages_turns(n: int) -> list[dict]:
    """Claude Code's shape: tool_use blocks, tool_result blocks in user turns, a system block."""
    messages: list[dict] = [{"role": "user", "content": [{"type": "text", "text": "fix it"}]}]
    bodies = []
    for turn in range(n):
        bodies.append({"model": "claude", "max_tokens": 256, "system": [
            {"type": "text", "text": "you are Claude Code"}], "messages": copy.deepcopy(messages),
            "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]})
        messages += [
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": f"think {turn}", "signature": "s"},
                {"type": "tool_use", "id": f"t{turn}", "name": "Bash",
                 "input": {"command": f"ls {turn}"}},
                {"type": "tool_use", "id": f"u{turn}", "name": "Bash", "input": {"command": "pwd"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": f"u{turn}", "content": "/w"},
                {"type": "tool_result", "tool_use_id": f"t{turn}", "content": f"out {turn}"},
            ]}]
    return bodies
