"""Measure a committed model from its weights, nothing sampled: the rank of the right tool call
among candidates after an agent's real prompt (mini-swe-agent's, opencode's).

Shared by the warm-start tests (tests/test_warm_model.py, tests/test_lookup_model.py): a rank is
the same number on every machine, so a test can assert a skill without depending on what a model
happens to sample, and compare it with the base model's to show the check can fail.
"""

from __future__ import annotations

import copy
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


def call_scores(model, prompt: list[int], calls: list[list[int]]) -> list[float]:
    """The model's log-probability of each whole call after `prompt`. The prompt is run once
    and each call against its keys and values (opencode's prompt is ~10k tokens): the same sums
    as whole-sequence forwards (tests/test_lookup_model.py checks it)."""
    with torch.no_grad():
        head = model(input_ids=torch.tensor([prompt]), use_cache=True)
        first = torch.log_softmax(head.logits[0, -1].float(), -1)
        scores = []
        for c in calls:
            logp = first[None]
            if len(c) > 1:
                cache = copy.deepcopy(head.cache)  # a forward appends its tokens to the cache
                logits = model(input_ids=torch.tensor([c[:-1]]), cache=cache,
                               use_cache=True).logits[0]
                logp = torch.cat([logp, torch.log_softmax(logits.float(), -1)])
            scores.append(logp.gather(1, torch.tensor(c)[:, None]).sum().item())
    return scores


def call_rank(model, prompt: list[int], calls: list[list[int]], right: int) -> int:
    """The rank (0 = first) of `calls[right]` among `calls` by `call_scores`."""
    scores = call_scores(model, prompt, calls)
    order = sorted(range(len(calls)), key=lambda i: -scores[i])
    return order.index(right)
