"""The committed tiny thinking model: its files, its tokens and Qwen3's reasoning rules.

    .venv/bin/python -m pytest tests/test_thinking_model.py -q

No engine: the template is rendered with transformers, as vLLM renders it (both `reasoning` and
`reasoning_content` on an assistant message, vllm/renderers/chat_utils.py). The real engine's
rendering is checked in tests/test_thinking_engine.py.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from launchers.thinking_model import (
    HARNESS_CONFIG,
    THINKING_CHAT_TEMPLATE,
    THINKING_MODEL,
    build_thinking_model,
    model_reasoning_parser,
)
from launchers.tiny_model import COMMITTED_MODEL, check_build_hashes

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
CALL = {"id": "c1", "type": "function",
        "function": {"name": "bash", "arguments": {"command": "ls"}}}


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(THINKING_MODEL)


@pytest.fixture(scope="module")
def tiny_tok():
    return AutoTokenizer.from_pretrained(COMMITTED_MODEL)


def render(tok, messages: list[dict], **kwargs) -> str:
    return tok.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                   add_generation_prompt=True, **kwargs)


def test_committed_files_match_build_json_and_share_the_tiny_models_weights():
    check_build_hashes(THINKING_MODEL, rebuild="python -m launchers.thinking_model")
    for name in ("model.safetensors", "tokenizer.json"):
        path = THINKING_MODEL / name
        assert path.is_symlink() and path.resolve() == (COMMITTED_MODEL / name).resolve()
    assert (THINKING_MODEL / "chat_template.jinja").read_text() == THINKING_CHAT_TEMPLATE


def test_rebuilding_gives_the_committed_files(tmp_path):
    # a sibling of a copy of the base, as in the repo (the links are relative)
    base = tmp_path / COMMITTED_MODEL.name
    base.mkdir()
    for path in COMMITTED_MODEL.iterdir():
        (base / path.name).write_bytes(path.read_bytes())
    built = build_thinking_model(tmp_path / THINKING_MODEL.name, base)
    for name in ("BUILD.json", "chat_template.jinja", HARNESS_CONFIG, "config.json"):
        assert (built / name).read_text() == (THINKING_MODEL / name).read_text(), name


def test_the_model_says_which_reasoning_parser_it_needs():
    assert model_reasoning_parser(THINKING_MODEL) == "qwen3"
    assert model_reasoning_parser(COMMITTED_MODEL) is None  # the tiny model does not think


def test_think_markers_are_single_tokens(tok):
    # vLLM's qwen3 parser needs both in the vocabulary (its parser engine scans token ids)
    assert len(tok.encode("<think>", add_special_tokens=False)) == 1
    assert len(tok.encode("</think>", add_special_tokens=False)) == 1


def test_without_reasoning_it_renders_exactly_as_the_tiny_template(tok, tiny_tok):
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "out"},
                {"role": "assistant", "content": "done"}, {"role": "user", "content": "next"}]
    assert render(tok, messages) == render(tiny_tok, messages)


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_reasoning_after_the_last_user_query_is_kept_between_tool_calls(tok, field):
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", field: "\nplan A\n", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "out"}]
    text = render(tok, messages)
    # Qwen3 strips the reasoning's newlines and writes its own around it
    assert "<|im_start|>assistant\n<think>\nplan A\n</think>\n\n<tool_call>\n" in text


def test_a_new_user_turn_drops_every_earlier_turns_reasoning(tok):
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "reasoning": "plan A", "tool_calls": [CALL]},
                {"role": "tool", "tool_call_id": "c1", "content": "out"},
                {"role": "assistant", "content": "done", "reasoning": "plan B"},
                {"role": "user", "content": "next"}]
    text = render(tok, messages)
    assert "plan" not in text and "<think>" not in text
    assert "<|im_start|>assistant\ndone<|im_end|>" in text


def test_reasoning_left_in_the_content_is_split_out_the_same_way(tok):
    # an agent whose engine ran without a reasoning parser sends the think block back as content
    before = [{"role": "user", "content": "q"},
              {"role": "assistant", "content": "<think>\nplan\n</think>\n\ndone"}]
    assert "<think>" not in render(tok, before + [{"role": "user", "content": "next"}])
    kept = render(tok, before + [{"role": "tool", "tool_call_id": "c1", "content": "x"}])
    assert "<|im_start|>assistant\n<think>\nplan\n</think>\n\ndone<|im_end|>" in kept


def test_a_tool_response_written_as_a_user_message_is_not_a_query(tok):
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "", "reasoning": "plan", "tool_calls": [CALL]},
                {"role": "user", "content": "<tool_response>\nout\n</tool_response>"}]
    assert "<think>\nplan\n</think>" in render(tok, messages)


def test_thinking_off_prefills_an_empty_think_block(tok):
    text = render(tok, [{"role": "user", "content": "q"}], enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render(tok, [{"role": "user", "content": "q"}]).endswith("<|im_start|>assistant\n")


def test_harness_json_is_plain_json():
    assert json.loads((THINKING_MODEL / HARNESS_CONFIG).read_text()) == {
        "reasoning_parser": "qwen3"}


def test_a_qwen3_snapshot_with_a_thinking_template_gets_the_qwen3_parser(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": THINKING_CHAT_TEMPLATE}))
    assert model_reasoning_parser(tmp_path) == "qwen3"
    # the same family with a template that does not think (Qwen3-Instruct-2507's kind): none
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert model_reasoning_parser(tmp_path) is None


def test_the_engine_command_turns_the_parser_on_from_the_model_alone():
    from launchers.engine import Engine

    thinking = Engine(THINKING_MODEL).command(on_gpu=False)
    assert thinking[thinking.index("--reasoning-parser") + 1] == "qwen3"
    assert "--reasoning-parser" not in Engine(COMMITTED_MODEL).command(on_gpu=False)
    # a parser given by hand is not given twice
    chosen = Engine(THINKING_MODEL, extra_args=["--reasoning-parser", "deepseek_r1"])
    assert chosen.command(on_gpu=False).count("--reasoning-parser") == 1
