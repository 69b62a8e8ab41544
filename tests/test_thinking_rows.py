"""Rewritten histories train exactly once: thinking rollouts, capture -> trace -> trainer rows.

    .venv/bin/python -m pytest tests/test_thinking_rows.py -q -s    (-s prints the bench figures)

The replies are chosen (harness/audit/scripted_engine.py, with the thinking model's real Qwen3
template and tokenizer): each writes a think block, then a tool call, the way a Qwen3 model does.
The scripted engine runs no reasoning parser, so the think block reaches the agent inside the
content and comes back there; Qwen3's template splits it out of the content exactly as it would
from a `reasoning` field (tests/test_thinking_model.py), so the tokens are the same either way.

Three rollouts of T calls, by how the agent sends its next turn:
  keep    tool results as `tool` messages: Qwen3 (and Qwen3.5) keep reasoning between tool calls,
          every call extends the last one, one row;
  strip   every observation as a `user` message (mini-swe-agent's habit): each user turn drops
          the earlier turns' thinking, so each call's prompt is a rewritten history, T rows;
  mixed   a tool loop, a new user turn, another tool loop: two rows.
What must hold for each (issue 34, part 2):
  * every row's tokens, up to the end of each call it holds, are exactly the engine's prompt and
    completion for that call (nothing re-tokenized, the context it was sampled in);
  * each sampled completion token is trained once: total trained = total sampled, and a row's
    trained tokens are its calls' completions in order (none twice, none dropped);
  * the capture's `joins` say how the calls joined (extended / rewritten).
Bench (the `strip` rollout): with the prefix-shared forward (trainer/prefix_tree.py) the tokens
forwarded stay within 1.2x of the rollout's unique tokens, while dense rows grow as O(T^2).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.audit.scripted_engine import ScriptedEngine, tool_call
from harness.shared.run_records import joins_by_agent, trace_joins
from launchers.thinking_model import THINKING_MODEL
from tests.helpers.rows_once import check_trained_once
from tests.helpers.tools import BASH_DESCRIBED_TOOLS as TOOLS
from trainer.prefix_tree import pack_tree

T = 8
POLICY = {"temperature": 1.0, "max_tokens": 256}
MESSAGES = [{"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "Find the failing test and fix it."}]


def reply(request: dict[str, Any]) -> str:
    step = sum(1 for m in request["messages"] if m["role"] in ("tool", "user")) - 1
    plan = f"Step {step}: the last output says where to look next, so list that folder."
    return f"<think>\n{plan}\n</think>\n\n" + tool_call("bash", command=f"ls dir{step}")


@pytest.fixture(scope="module")
def admin() -> Iterator[Any]:
    from capture import CaptureClient, CaptureServer

    with ScriptedEngine(THINKING_MODEL, reply) as engine, CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        yield client


def rollout(admin: Any, user_turn_at: set[int]) -> tuple[list[dict], dict]:
    """T calls; after call k the result goes back as a `user` message if k is in
    `user_turn_at`, else as a `tool` message. Returns the trace's turns and the stats."""
    info = admin.create_session(sampling=POLICY)
    messages = [dict(m) for m in MESSAGES]
    for k in range(T):
        answer = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=60,
                            headers={"authorization": f"Bearer {info.secret}"},
                            json={"model": "tiny", "messages": messages, "tools": TOOLS})
        assert answer.status_code == 200, answer.text
        message = answer.json()["choices"][0]["message"]
        assert message["content"].startswith("<think>\nStep ")  # the agent gets the think block
        messages.append({k: v for k, v in message.items()
                         if k in ("role", "content", "tool_calls")})
        output = f"a.txt dir{k + 1}/"
        if k in user_turn_at:
            messages.append({"role": "user", "content": f"Output of your command:\n{output}"})
        else:
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"],
                             "content": output})
    trace = json.loads(admin.trace_json(info.session_id))
    return trace, admin.stats(info.session_id)


def test_reasoning_kept_between_tool_calls_chains_into_one_row(admin):
    trace, stats = rollout(admin, user_turn_at=set())
    rows = check_trained_once(trace)
    assert len(rows) == 1
    assert stats["joins"] == {"extended": T - 1, "branched": 0, "rewritten": 0, "new_root": 1}


def test_reasoning_stripped_at_every_user_turn_trains_each_call_once_in_its_own_context(admin):
    trace, stats = rollout(admin, user_turn_at=set(range(T)))
    rows = check_trained_once(trace)
    assert len(rows) == T  # every call's prompt dropped the thinking its parent sampled
    assert stats["joins"] == {"extended": 0, "branched": 0, "rewritten": T - 1, "new_root": 1}
    assert stats["unplaced"] == 0  # rewritten histories of the same task: placed, trained
    # the run's records count the same from the trace alone (summary.json's `joins`)
    assert trace_joins(trace) == stats["joins"]
    assert joins_by_agent([{"joins": trace_joins(trace)}] * 2, "mini-swe-agent") == {
        "mini-swe-agent": {"extended": 0, "branched": 0, "rewritten": 2 * (T - 1), "new_root": 2}}

    # Bench: what training these rows costs, dense against prefix-shared.
    _, tree = pack_tree(rows, [row.loss_mask for row in rows], [1.0] * len(rows),
                        budget=1 << 20)
    dense = sum(len(row) for row in rows)
    print(f"\n[bench] strip, T={T}: unique tokens {tree.unique_tokens}, dense row tokens "
          f"{dense} ({dense / tree.unique_tokens:.2f}x), prefix-shared forwarded "
          f"{tree.tokens_forwarded} ({tree.tokens_forwarded / tree.unique_tokens:.2f}x)")
    assert tree.tokens_forwarded <= 1.2 * tree.unique_tokens
    assert dense > 3 * tree.unique_tokens  # what the sharing saves at T=8 (grows with T)


def test_a_user_turn_between_two_tool_loops_starts_one_rewritten_row(admin):
    trace, stats = rollout(admin, user_turn_at={T // 2 - 1})
    rows = check_trained_once(trace)
    assert len(rows) == 2
    assert [len(row.node_ids) for row in rows] == [T // 2, T // 2]
    assert stats["joins"] == {"extended": T - 2, "branched": 0, "rewritten": 1, "new_root": 1}
