"""The translation memo: a resent history is not re-translated, and the result never changes.

    .venv/bin/python -m pytest tests/test_dialects_memo.py -q

Every test compares the memo's translation with the memo-free one (the dialects' own code path),
so a reuse that changed a single field would fail here.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from capture.dialects import DIALECTS, DialectError
from capture.dialects.memo import KEEP, TranslationMemo
from tests.helpers.conversations import chat_turns, messages_turns

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"


def both_ways(dialect: str, body: dict, memo: TranslationMemo) -> dict:
    fresh = DIALECTS[dialect].to_chat(copy.deepcopy(body))
    memoised = DIALECTS[dialect].to_chat(copy.deepcopy(body), memo)
    assert memoised == fresh
    return memoised


@pytest.mark.parametrize(("dialect", "bodies"), [("chat", chat_turns(30)),
                                                  ("messages", messages_turns(30))])
def test_a_growing_history_translates_only_its_new_messages(dialect, bodies):
    memo = TranslationMemo()
    for body in bodies:
        before = memo.misses
        both_ways(dialect, body, memo)
        new = memo.misses - before
        assert new <= 2 or body is bodies[0], f"translated {new} items of a resent history"
    total = sum(len(b["messages"]) for b in bodies)
    assert memo.hits + memo.misses == total
    assert memo.misses == len(bodies[-1]["messages"])  # each message translated exactly once


def test_a_rewritten_history_is_translated_again_from_where_it_changed():
    bodies = chat_turns(12)
    memo = TranslationMemo()
    for body in bodies[:10]:
        both_ways("chat", body, memo)
    compacted = copy.deepcopy(bodies[11])
    compacted["messages"][5]["content"] = "summary of earlier turns"
    hits = memo.hits
    out = both_ways("chat", compacted, memo)
    assert memo.hits - hits == 5  # messages before the rewrite are reused, none after
    assert out["messages"][5]["content"] == "summary of earlier turns"


def test_an_equal_looking_but_different_value_is_never_reused():
    body = chat_turns(3)[2]
    memo = TranslationMemo()
    both_ways("chat", body, memo)
    changed = copy.deepcopy(body)
    changed["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"command": "rm"}'
    out = both_ways("chat", changed, memo)
    assert out["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"command": "rm"}'


def test_interleaved_conversations_each_keep_their_translations():
    main, side = chat_turns(20, seed=1), chat_turns(20, seed=2)
    for body in side:
        body["messages"][1]["content"] = "subagent task"
    memo = TranslationMemo()
    for a, b in zip(main, side, strict=True):
        both_ways("chat", a, memo)
        misses = memo.misses
        both_ways("chat", b, memo)
        assert memo.misses - misses <= 2 or b is side[0]
    assert memo.misses == len(main[-1]["messages"]) + len(side[-1]["messages"]) - 1  # shared system


def test_only_the_most_recent_conversations_are_remembered():
    memo = TranslationMemo()
    for k in range(KEEP + 2):
        body = chat_turns(2)[1]
        body["messages"][1]["content"] = f"task {k}"
        both_ways("chat", body, memo)
    assert len(memo._runs["chat.messages"]) == KEEP


def test_a_bad_message_after_a_reused_prefix_still_fails_and_does_not_poison_the_memo():
    bodies = chat_turns(4)
    memo = TranslationMemo()
    both_ways("chat", bodies[2], memo)
    bad = copy.deepcopy(bodies[3])
    bad["messages"][-1]["role"] = "wizard"
    with pytest.raises(DialectError, match=r"messages\[7\]\.role"):
        DIALECTS["chat"].to_chat(bad, memo)
    both_ways("chat", bodies[3], memo)


def test_the_unchanged_tool_manifest_is_translated_once_per_session():
    bodies = messages_turns(3)
    memo = TranslationMemo()
    first = DIALECTS["messages"].to_chat(copy.deepcopy(bodies[0]), memo)
    second = DIALECTS["messages"].to_chat(copy.deepcopy(bodies[1]), memo)
    assert second["tools"] is first["tools"]
    changed = copy.deepcopy(bodies[2])
    changed["tools"].append({"name": "Read", "input_schema": {"type": "object"}})
    assert [t["function"]["name"] for t in both_ways("messages", changed, memo)["tools"]] == [
        "Bash", "Read"]


@pytest.mark.parametrize("agent", ["opencode", "claude", "codex", "mini"])
def test_recorded_agent_bodies_translate_the_same_through_one_session_memo(agent):
    records = [json.loads(p.read_text()) for p in sorted((FIXTURES / agent).glob("*.json"))]
    memo = TranslationMemo()
    for record in records:
        both_ways(record["dialect"], record["body"], memo)
    if agent != "codex":  # Responses input is translated whole (responses_request docstring)
        assert memo.hits > 0, "the agent's second call resends its first: it must be reused"
