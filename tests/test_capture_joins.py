"""How calls join the rollout graph, and the opencode case (issue 34, part 3).

    .venv/bin/python -m pytest tests/test_capture_joins.py -q

The case: an opencode run whose calls 4-10 were recorded as children of turn 2 instead of
continuing turn 3. Reproduced with opencode itself against the scripted engine (replies: a tool
call; "Now b.\\n" + a tool call; "Now c." + a tool call; a tool call): calls 4 and 5 were
children of call 2 ("branched"), call 6 extended call 5. Its cause is not the agent and not the
graph but the tiny model's template and vLLM's hermes parser, which are not inverses of each other
when a reply has text before its tool call:

    sampled          "Now b.\\n<tool_call>..."   -> parser content "Now b.\\n" (text before the markup,
                                                  untrimmed: vllm/tool_parsers/hermes_tool_parser.py)
    re-rendered      "Now b.\\n" + "\\n" + "<tool_call>..." (the template joins content and call
                                                  with "\\n", as Qwen's does)
    sampled          "Now c.<tool_call>..."    -> re-rendered "Now c.\\n<tool_call>..."

So the next prompt is a rewritten history that differs inside the previous call's completion: its
longest exact prefix among the recorded calls ends at the last call whose completion did
round-trip (turn 2: a bare tool call), and every later call that still carries the re-rendered
turn hangs there too, until a call whose own completion round-trips is extended again. The graph is
right (exact prefix or nothing, capture/graph.py): attaching call 4 under call 3 would claim the
model saw tokens it never saw. Training is right too (below: each call trained once, in its
own context); the joins count it as `branched`.

Not fixed, documented: with this template and parser no reply with text before its call can
round-trip ("text\n<tool_call>" comes back as "text\n\n<tool_call>", "text<tool_call>" as
"text\n<tool_call>"), and Qwen3's own template joins content and calls the same way. A template
that rendered `content.rstrip('\n') + '\n'` would make "text\n<tool_call>" round-trip; changing
the committed tiny models' template is a rebuild of all of them (launchers/tiny_model.py
BUILDER_VERSION), left for a later change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.audit.scripted_engine import ScriptedEngine, tool_call
from tests.helpers.rows_once import check_trained_once
from tests.helpers.tools import BASH_DESCRIBED_TOOLS as TOOLS

POLICY = {"temperature": 1.0, "max_tokens": 256}
MESSAGES = [{"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": "Run the commands."}]
# What the model writes at each step (the k-th reply, k = tool results so far): opencode's run
REPLIES = [tool_call("bash", command="echo a"),
           "Now b.\n" + tool_call("bash", command="echo b"),
           "Now c." + tool_call("bash", command="echo c"),
           tool_call("bash", command="echo d"),
           "Done."]


@pytest.fixture
def admin(tiny_model_path) -> Iterator[Any]:
    from capture import CaptureClient, CaptureServer

    def script(request: dict[str, Any]) -> str:
        return REPLIES[sum(1 for m in request["messages"] if m["role"] == "tool")]

    with ScriptedEngine(tiny_model_path, script) as engine, CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as client:
        yield client


def test_text_before_a_tool_call_that_does_not_round_trip_branches_from_the_last_turn_that_did(
        admin):
    info = admin.create_session(sampling=POLICY)
    messages = [dict(m) for m in MESSAGES]
    for k in range(len(REPLIES)):
        answer = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=60,
                            headers={"authorization": f"Bearer {info.secret}"},
                            json={"model": "tiny", "messages": messages, "tools": TOOLS})
        assert answer.status_code == 200, answer.text
        message = answer.json()["choices"][0]["message"]
        # the agent sends back what it got, as opencode does: content as the parser cut it
        messages.append({key: value for key, value in message.items()
                         if key in ("role", "content", "tool_calls")})
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": f"out {k}"})
    trace = json.loads(admin.trace_json(info.session_id))
    turns = trace["turns"]
    assert [t["metadata"]["join"] for t in turns] == [
        "new_root", "extended", "branched", "branched", "extended"]
    ids = [t["node_id"] for t in turns]
    # calls 2 and 3 (each after a reply with text before its call) hang off call 0, the last
    # call whose completion the template rendered back token for token; call 4 extends call 3
    # (call 3's reply is a bare tool call, which round-trips)
    assert [t["metadata"]["parent_id"] for t in turns] == [None, ids[0], ids[0], ids[0], ids[3]]
    assert admin.stats(info.session_id)["joins"] == {
        "extended": 2, "branched": 2, "rewritten": 0, "new_root": 1}
    # the viewer's turns carry the same word (harness/view/turns.py)
    from harness.view.turns import turns_view

    assert [t["join"] for t in turns_view(turns)] == [t["metadata"]["join"] for t in turns]
    rows = check_trained_once(trace)
    # the trainer starts a row wherever the prompt stops extending the last one: nothing twice
    assert [row.node_ids for row in rows] == [ids[:2], [ids[2]], ids[3:]]


def test_a_retry_nobody_continued_does_not_make_the_continued_call_a_branch(tiny_model_path):
    import itertools

    from capture import CaptureClient, CaptureServer

    replies = itertools.count()
    with ScriptedEngine(tiny_model_path, lambda request: f"Reply {next(replies)}.") as engine, \
            CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        info = admin.create_session(sampling=POLICY)

        def chat(messages: list[dict]) -> str:
            answer = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=60,
                                headers={"authorization": f"Bearer {info.secret}"},
                                json={"model": "tiny", "messages": messages})
            assert answer.status_code == 200, answer.text
            return answer.json()["choices"][0]["message"]["content"]

        first = chat(MESSAGES)  # call 1: "Reply 0."
        history = [*MESSAGES, {"role": "assistant", "content": first},
                   {"role": "user", "content": "next"}]
        chat(history)  # call 2, "Reply 1.": dropped, the agent retried it...
        again = chat(history)  # call 3, "Reply 2.": ...and went on from this one
        chat([*history, {"role": "assistant", "content": again},
              {"role": "user", "content": "more"}])  # call 4
        stats = admin.stats(info.session_id)
    assert stats["discarded"] == 1
    # calls 1, 3, 4 retained: 3 is the first retained child of 1, 4 extends 3
    assert stats["joins"] == {"extended": 2, "branched": 0, "rewritten": 0, "new_root": 1}
