"""Measure a committed model from its weights, nothing sampled: the rank of the right tool call
among candidates after an agent's real prompt (mini-swe-agent's, opencode's).

Shared by the warm-start tests (tests/test_warm_model.py, tests/test_lookup_model.py): a rank is
the same number on every machine, so a test can assert a skill without depending on what a model
happens to sample, and compare it with the base model's to show the check can fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

MINI_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dialects" / "mini" / "00_chat.json"
_RECORDED = "Say hi by running echo hi in the shell."  # the fixture's own instruction


def mini_first_request(instruction: str) -> tuple[list[dict], list[dict]]:
    """mini-swe-agent's recorded first request (messages, tools) with `instruction` in place of
    the one it was recorded with."""
    body = json.loads(MINI_FIXTURE.read_text())["body"]
    messages = [dict(m) for m in body["messages"]]
    assert _RECORDED in messages[1]["content"], "the fixture's instruction moved"
    messages[1]["content"] = messages[1]["content"].replace(_RECORDED, instruction)
    return messages, body["tools"]


OPENCODE_FIXTURE = MINI_FIXTURE.parents[1] / "opencode" / "01_chat.json"


def opencode_first_request(instruction: str) -> tuple[list[dict], list[dict]]:
    """opencode's recorded first request (its ~9.7k-token system prompt and 10 tools) with
    `instruction` in place of the one it was recorded with."""
    body = json.loads(OPENCODE_FIXTURE.read_text())["body"]
    messages = [dict(m) for m in body["messages"]]
    assert _RECORDED in messages[-1]["content"], "the fixture's instruction moved"
    messages[-1]["content"] = messages[-1]["content"].replace(_RECORDED, instruction)
    return messages, body["tools"]


def encode_prompt(tok, messages: list[dict], tools: list[dict]) -> list[int]:
    """The prompt ids the engine would see: the model's own chat template, generation prompt on."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                   tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def call_rank(model, prompt: list[int], calls: list[list[int]], right: int) -> int:
    """The rank (0 = first) of `calls[right]` among `calls` by the model's log-probability of the
    whole call after `prompt`."""
    width = len(prompt) + max(map(len, calls))
    ids = torch.zeros(len(calls), width, dtype=torch.long)
    for i, c in enumerate(calls):  # right-padded: a causal model never sees the padding
        ids[i, :len(prompt) + len(c)] = torch.tensor(prompt + c)
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits.float(), -1)
    scores = [logp[i, len(prompt) - 1:len(prompt) + len(c) - 1]
              .gather(1, torch.tensor(c)[:, None]).sum().item() for i, c in enumerate(calls)]
    order = sorted(range(len(calls)), key=lambda i: -scores[i])
    return order.index(right)
