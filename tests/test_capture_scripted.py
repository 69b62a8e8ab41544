"""The rollout graph on real token ids with chosen replies: the proxy in front of a scripted engine.

test_capture_engine.py checks the proxy against vLLM itself, but whether the tiny model's sampled
ids re-render to themselves when sent back is up to what it samples (a 1-token reply often does
not), so a test there can only compare parents with the prefix oracle. Here the replies are
chosen (harness/audit/scripted_engine.py: the tiny tokenizer's real ids, vLLM's wire shape), so the graph's
behaviour on a conversation that does chain, and on a retry, is asserted exactly.

Run: .venv/bin/python -m pytest tests/test_capture_scripted.py -q
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.audit.scripted_engine import ScriptedEngine, tool_call
from tests.helpers.prefix_oracle import turn_parent
from tests.helpers.tools import BASH_DESCRIBED_TOOLS as TOOLS

MESSAGES = [{"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "List the files, then fix the failing test."}]
POLICY = {"temperature": 1.0, "max_tokens": 64}


@pytest.fixture
def scripted(tiny_model_path: Path) -> Iterator[tuple[ScriptedEngine, Any]]:
    from capture import CaptureClient, CaptureServer

    replies = itertools.count()
    with ScriptedEngine(tiny_model_path, lambda request: f"Reply {next(replies)}.") as engine, \
            CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        yield engine, admin


def chat(info: Any, messages: list[dict], stream: bool = False) -> dict:
    """One call; returns the assistant message as the agent saw it."""
    body = {"model": "tiny", "messages": messages, "tools": TOOLS, "stream": stream}
    headers = {"authorization": f"Bearer {info.secret}"}
    url = f"{info.base_urls['chat']}/chat/completions"
    if not stream:
        reply = httpx.post(url, json=body, headers=headers, timeout=60)
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict] = {}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices", []):
                message["content"] += choice["delta"].get("content") or ""
                for part in choice["delta"].get("tool_calls") or []:
                    call = calls.setdefault(part["index"], {
                        "id": part.get("id"), "type": "function",
                        "function": {"name": "", "arguments": ""}})
                    call["function"]["name"] += part.get("function", {}).get("name") or ""
                    call["function"]["arguments"] += part.get("function", {}).get("arguments") or ""
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def turns(admin: Any, info: Any) -> list[dict]:
    return json.loads(admin.trace_json(info.session_id))["turns"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_conversation_sent_back_unchanged_chains_every_turn(scripted, stream):
    engine, admin = scripted
    calls = itertools.count()
    # turns 0, 2, 4 call the tool; 1, 3, 5 answer in words
    engine.script = lambda request: (tool_call("bash", command=f"ls {n}") if (n := next(calls)) % 2
                                     == 0 else f"Listed {n}.")
    info = admin.create_session(sampling=POLICY)
    messages = list(MESSAGES)
    for turn in range(6):
        message = chat(info, messages, stream)
        messages.append({k: v for k, v in message.items()
                         if k in ("role", "content", "tool_calls")})
        if message.get("tool_calls"):
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                             "content": f"a.txt b.txt ({turn})"})
        else:
            messages.append({"role": "user", "content": f"go on ({turn})"})
    recorded = turns(admin, info)
    assert [bool(t["response"]["choices"][0]["message"].get("tool_calls")) for t in recorded] \
        == [True, False] * 3
    for i, turn in enumerate(recorded):
        assert turn["metadata"]["parent_id"] == turn_parent(turn, recorded[:i])
        # each call extends the one before it: one root, one path
        assert turn["metadata"]["parent_id"] == (recorded[i - 1]["node_id"] if i else None)
    assert admin.stats(info.session_id)["graph"]["n_roots"] == 1


def test_a_retried_call_keeps_only_the_branch_that_was_continued(scripted):
    engine, admin = scripted
    info = admin.create_session(sampling=POLICY)
    first = chat(info, MESSAGES)  # "Reply 0."
    retried = chat(info, MESSAGES)  # the agent retried the same prompt ("Reply 1."), then went on
    assert first["content"] != retried["content"]
    chat(info, [*MESSAGES, {"role": "assistant", "content": first["content"]},
                {"role": "user", "content": "next"}])
    recorded = turns(admin, info)
    assert [t["node_id"] for t in recorded] == [f"{info.session_id}:1", f"{info.session_id}:3"]
    assert recorded[1]["metadata"]["parent_id"] == recorded[0]["node_id"]
    assert admin.stats(info.session_id)["discarded"] == 1
