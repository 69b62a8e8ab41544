"""The scripted engine speaks vLLM's wire shape and renders prompts as vLLM does.

The agent, capture and rollout tests that use harness/audit/scripted_engine.py are only as good as its
likeness to vLLM, so it is checked here: replies (whole and streamed) carry ids, logprobs and
parsed tool calls the way vLLM 0.32 writes them, a history sent back extends the prompt +
completion token for token, and, against the real engine, its prompt ids for every recorded
agent body are vLLM's own tokenization.

Run: .venv/bin/python -m pytest tests/test_scripted_engine.py -q
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from capture.dialects import DIALECTS
from harness.audit.scripted_engine import ScriptedEngine, parse_hermes, tool_call
from tests.helpers.tools import BASH_DESCRIBED_TOOLS as TOOLS

MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Create hello.txt containing hello."}]
CALL = tool_call("bash", command="echo hello > hello.txt")
FIXTURES = Path(__file__).parent / "fixtures" / "dialects"


@pytest.fixture
def scripted(tiny_model_path: Path) -> Iterator[ScriptedEngine]:
    with ScriptedEngine(tiny_model_path, lambda request: CALL) as scripted:
        yield scripted


def post(engine: ScriptedEngine, **body: Any) -> dict:
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "logprobs": True,
            "return_token_ids": True, **body}
    reply = httpx.post(f"{engine.url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream(engine: ScriptedEngine, **body: Any) -> list[dict]:
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "logprobs": True,
            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True},
            **body}
    with httpx.stream("POST", f"{engine.url}/v1/chat/completions", json=body,
                      timeout=30) as reply:
        assert reply.status_code == 200
        lines = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_tool_call_reply_carries_ids_logprobs_and_the_parsed_call(scripted):
    engine = scripted
    reply = post(engine)
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"] == engine.prompt_ids({"messages": MESSAGES, "tools": TOOLS})
    # the reply's own ids: the tokenizer's encoding of the text, then <|im_end|>
    assert choice["token_ids"] == engine.completion_ids(CALL)
    assert choice["token_ids"][-1] == engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert engine.tokenizer.decode(choice["token_ids"]) == CALL + "<|im_end|>"
    entries = choice["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert all(e["logprob"] < 0 for e in entries)
    message = choice["message"]
    assert message["content"] is None and choice["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    assert call["id"].startswith("chatcmpl-tool-")
    assert call["function"] == {"name": "bash",
                                "arguments": '{"command": "echo hello > hello.txt"}'}
    assert reply["usage"]["completion_tokens"] == len(choice["token_ids"])


def test_a_streamed_reply_says_what_the_whole_reply_says(scripted):
    engine = scripted
    whole = post(engine)["choices"][0]
    chunks = stream(engine)
    assert chunks[0]["prompt_token_ids"] and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    choices = [c for chunk in chunks[1:] for c in chunk["choices"]]
    assert [t for c in choices for t in c["token_ids"]] == whole["token_ids"]
    assert [e for c in choices for e in c["logprobs"]["content"]] == whole["logprobs"]["content"]
    fragments = [f for c in choices for f in c["delta"].get("tool_calls") or []]
    assert fragments[0]["function"] == {"name": "bash"} and fragments[0]["id"]
    arguments = "".join(f["function"].get("arguments") or "" for f in fragments)
    assert arguments == whole["message"]["tool_calls"][0]["function"]["arguments"]
    assert [c["finish_reason"] for c in choices][-1] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(
        whole["token_ids"])


def test_a_reply_longer_than_max_tokens_is_cut_there(scripted):
    engine = scripted
    choice = post(engine, max_tokens=3)["choices"][0]
    assert len(choice["token_ids"]) == 3 and choice["finish_reason"] == "length"
    # three tokens of an unfinished call: no call parsed, the text is content (vLLM's hermes)
    assert not choice["message"]["tool_calls"]
    assert choice["message"]["content"].startswith("<tool_call>")
    assert stream(engine, max_tokens=3)[-2]["choices"][0]["finish_reason"] == "length"


def test_the_history_sent_back_extends_the_prompt_and_completion(scripted):
    engine = scripted
    first = post(engine)
    call = first["choices"][0]["message"]["tool_calls"][0]
    history = [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": call["id"], "content": "done"}]
    second = post(engine, messages=history)
    end = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    assert second["prompt_token_ids"][: len(end)] == end
    assert len(second["prompt_token_ids"]) > len(end)


def test_a_call_whose_json_does_not_parse_stays_content():
    assert parse_hermes("<tool_call>\n{not json}\n</tool_call>") == (
        "<tool_call>\n{not json}\n</tool_call>", [])
    content, calls = parse_hermes("Running it.\n" + CALL)
    assert content == "Running it.\n" and calls[0]["function"]["name"] == "bash"


def test_another_model_name_and_a_failing_script_get_vllms_errors(scripted):
    engine = scripted
    reply = httpx.post(f"{engine.url}/v1/chat/completions", timeout=30,
                       json={"model": "gpt-4", "messages": MESSAGES})
    assert reply.status_code == 404 and "gpt-4" in reply.json()["error"]["message"]
    engine.script = lambda request: 1 / 0
    reply = httpx.post(f"{engine.url}/v1/chat/completions", timeout=30,
                       json={"model": "tiny", "messages": MESSAGES})
    assert reply.status_code == 500 and "ZeroDivisionError" in reply.json()["error"]["message"]
    assert isinstance(engine.errors[-1], ZeroDivisionError) and engine.replies[-1] is None


def test_what_it_does_not_emulate_is_refused_not_answered(scripted):
    engine = scripted
    for extra in ({"stop": ["hello"]}, {"n": 2}):  # the reply (CALL) says "hello"
        reply = httpx.post(f"{engine.url}/v1/chat/completions", timeout=30,
                           json={"model": "tiny", "messages": MESSAGES, **extra})
        assert reply.status_code == 500 and "not emulated" in reply.json()["error"]["message"]
    assert post(engine, stop=["never said"])["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.engine
@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*/*.json")),
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_prompt_ids_are_vllms_own_tokenization_of_real_agent_bodies(engine, scripted, path):
    """Every recorded agent body, translated to chat as the proxy does: the scripted engine's
    prompt ids are vLLM's own /tokenize of the same messages and tools (the renderer is the one
    chat completions use)."""
    record = json.loads(path.read_text())
    chat = DIALECTS[record["dialect"]].to_chat(record["body"])
    body = {"model": engine.model, "messages": chat["messages"], "add_generation_prompt": True}
    if chat.get("tools"):
        body["tools"] = chat["tools"]
    reply = httpx.post(f"{engine.url}/tokenize", json=body, timeout=120)
    assert reply.status_code == 200, reply.text[:500]
    expected, got = reply.json()["tokens"], scripted.prompt_ids(chat)
    if got != expected:
        at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                  min(len(got), len(expected)))
        decode = scripted.tokenizer.decode
        pytest.fail(f"prompt ids differ from position {at} of {len(expected)}: vLLM "
                    f"{decode(expected[at:at + 30])!r}, scripted {decode(got[at:at + 30])!r}")
