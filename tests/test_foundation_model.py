"""The tiny default model: committed and hash-checked, rebuildable deterministically, loadable by
transformers.

Run: .venv/bin/python -m pytest tests/test_foundation_model.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from launchers.tiny_model import (
    BUILDER_VERSION,
    COMMITTED_MODEL,
    TinyModelError,
    build_tiny_model,
    committed_tiny_model,
)
from tests.helpers.tools import BASH_TOOLS


def test_tiny_model_is_qwen3_with_head_dim_32_and_32k_context(tiny_model_path: Path) -> None:
    config = json.loads((tiny_model_path / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["head_dim"] == 32
    assert config["max_position_embeddings"] == 32768
    assert config["num_hidden_layers"] == 2


def test_tiny_model_loads_in_transformers_and_scores_a_chat(tiny_model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}],
                                        add_generation_prompt=True, return_dict=False)
    logits = model(torch.tensor([ids])).logits  # [1, T, V]
    assert logits.shape == (1, len(ids), model.config.vocab_size)
    assert torch.isfinite(logits).all()


def test_tokenizer_round_trips_code_and_keeps_tool_markup_as_single_tokens(tiny_model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    text = 'def f(x):\n    return {"a": [1, 2]}  # ünïcode ✓\n'
    assert tokenizer.decode(tokenizer.encode(text)) == text
    for markup in ("<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>", "<think>"):
        assert len(tokenizer.encode(markup)) == 1, markup
    # Tool markup must survive decoding with special tokens skipped: the hermes parser reads it.
    call = tokenizer.encode("<tool_call>\n{}\n</tool_call>")
    assert "<tool_call>" in tokenizer.decode(call, skip_special_tokens=True)


def test_chat_template_renders_tools_calls_and_results_in_hermes_format(tiny_model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "list files"}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
            {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": {"command": "pwd"}}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "c2", "content": "/app"},
    ]
    tools = BASH_TOOLS
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nbe brief\n\n# Tools")
    assert '\n{"type": "function", "function": {"name": "bash"' in text
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call><|im_end|>') in text
    # Consecutive tool results share one user turn.
    assert ("<|im_start|>user\n<tool_response>\na.txt\n</tool_response>\n<tool_response>\n/app\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n") in text


def test_building_twice_from_the_same_seed_gives_identical_weights(tmp_path: Path) -> None:
    # A short warm-up keeps this test cheap; the full one runs the same code for more steps.
    first = build_tiny_model(seed=0, root=tmp_path / "a", warmup_steps=3)
    second = build_tiny_model(seed=0, root=tmp_path / "b", warmup_steps=3)
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()


def test_warm_up_teaches_the_hermes_tool_call_format(tiny_model_path: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    tools = BASH_TOOLS
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Create hello.txt containing hello."}],
                                        tools=tools, add_generation_prompt=True, return_dict=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False,
                         eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    text = tokenizer.decode(out[0][len(ids):])
    # Greedy decoding after the warm-up: a tool call that ends its turn.
    assert text.startswith("<tool_call>"), text
    assert text.endswith("<|im_end|>"), text


def test_a_cached_model_is_reused_without_rebuilding(tiny_model_path: Path) -> None:
    marker = (tiny_model_path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model() == tiny_model_path
    assert (tiny_model_path / "model.safetensors").stat().st_mtime_ns == marker


def test_the_default_model_is_the_committed_one_with_every_file_hashed() -> None:
    # The same bytes on every machine: no machine-specific rebuild behind the tests and the runs.
    assert build_tiny_model() == COMMITTED_MODEL
    build = json.loads((COMMITTED_MODEL / "BUILD.json").read_text())
    assert build["builder"] == BUILDER_VERSION and build["seed"] == 0
    on_disk = {p.name for p in COMMITTED_MODEL.iterdir() if p.is_file() and p.name != "BUILD.json"}
    assert on_disk == set(build["files"]) and {"model.safetensors", "tokenizer.json"} <= on_disk


def test_a_changed_committed_file_is_refused_by_name(tmp_path: Path) -> None:
    copy = tmp_path / "tiny"
    shutil.copytree(COMMITTED_MODEL, copy)
    assert committed_tiny_model(copy) == copy
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(TinyModelError, match="model.safetensors does not match"):
        committed_tiny_model(copy)


def test_a_committed_model_of_another_builder_version_is_not_used(tmp_path: Path) -> None:
    copy = tmp_path / "tiny"
    shutil.copytree(COMMITTED_MODEL, copy)
    build = json.loads((copy / "BUILD.json").read_text())
    (copy / "BUILD.json").write_text(json.dumps({**build, "builder": BUILDER_VERSION - 1}))
    assert committed_tiny_model(copy) is None
