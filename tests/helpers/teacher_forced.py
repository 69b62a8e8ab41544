"""Measure a committed model from its weights, nothing sampled: the rank of the right tool call
among candidates after an agent's real prompt (mini-swe-agent's, opencode's, Claude Code's).

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


CLAUDE_SANDBOX_PROMPT = MINI_FIXTURE.parents[1] / "claude" / "sandbox_first_prompt.txt"
_INSTRUCTION = "{{INSTRUCTION}}"


def claude_sandbox_prompt(tok, instruction: str, call: str | None = None,
                          output: str | None = None) -> list[int]:
    """Claude Code's first prompt ids as the engine got them in our sandbox, with `instruction`;
    with a `call` (the model's text) and the `output` Claude Code sent back, the second prompt.

    The text is a lookup rollout's recorded first prompt (2026-12-06, ~21k tokens: run with
    `--disable-slash-commands`, cwd /app, the day's date) with its instruction cut out. The
    Messages fixture (claude/00_messages.json) was recorded in another directory, without that
    flag: a model taught on the sandbox's prompt reads the named file in 98% of its test
    rollouts, and on that prompt picks one file whatever the instruction names. Both prompts
    were checked equal, id for id, to the rollout's recorded ones when the text was cut."""
    text = CLAUDE_SANDBOX_PROMPT.read_text()
    assert text.count(_INSTRUCTION) == 1, "the recorded prompt's instruction mark moved"
    text = text.replace(_INSTRUCTION, instruction)
    if call is not None:  # the tiny model's chat template, as the recorded second prompt shows
        text += (call + "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + (output or "")
                 .rstrip("\n") + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    return tok.encode(text, add_special_tokens=False)


def encode_prompt(tok, messages: list[dict], tools: list[dict]) -> list[int]:
    """The prompt ids the engine would see: the model's own chat template, generation prompt on."""
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True,
                                   tokenize=False)
    return tok.encode(text, add_special_tokens=False)


class SharedHead:
    """The keys and values of a prompt head that many scored prompts start with (an agent's
    system prompt and tools: Claude Code's is ~15k tokens), run once."""

    def __init__(self, model, ids: list[int]) -> None:
        with torch.no_grad():
            self.ids, self.cache = ids, model(input_ids=torch.tensor([ids]), use_cache=True).cache

    def run(self, model, prompt: list[int]):
        """`prompt`'s forward, given the head's keys and values (the same logits as its whole)."""
        n = len(self.ids)
        if prompt[:n] != self.ids or len(prompt) == n:
            raise ValueError("the prompt does not extend the shared head")
        cache = copy.deepcopy(self.cache)  # a forward appends its tokens to the cache
        return model(input_ids=torch.tensor([prompt[n:]]), cache=cache, use_cache=True)


def call_scores(model, prompt: list[int], calls: list[list[int]],
                head: SharedHead | None = None) -> list[float]:
    """The model's log-probability of each whole call after `prompt`. The prompt is run once
    (past the `head` it starts with, where one is given) and each call against its keys and
    values: the same sums as whole-sequence forwards (tests/test_lookup_model.py checks it)."""
    with torch.no_grad():
        out = head.run(model, prompt) if head is not None else model(
            input_ids=torch.tensor([prompt]), use_cache=True)
        first = torch.log_softmax(out.logits[0, -1].float(), -1)
        scores = []
        for c in calls:
            logp = first[None]
            if len(c) > 1:
                cache = copy.deepcopy(out.cache)
                logits = model(input_ids=torch.tensor([c[:-1]]), cache=cache,
                               use_cache=True).logits[0]
                logp = torch.cat([logp, torch.log_softmax(logits.float(), -1)])
            scores.append(logp.gather(1, torch.tensor(c)[:, None]).sum().item())
    return scores


def call_rank(model, prompt: list[int], calls: list[list[int]], right: int,
              head: SharedHead | None = None) -> int:
    """The rank (0 = first) of `calls[right]` among `calls` by `call_scores`."""
    scores = call_scores(model, prompt, calls, head)
    order = sorted(range(len(calls)), key=lambda i: -scores[i])
    return order.index(right)
