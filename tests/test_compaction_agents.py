"""Each agent that can compact its history is made to, and the compaction is captured (issue 34, 4).

    nice -n 15 .venv/bin/python -m pytest tests/test_compaction_agents.py -q -s

Agents summarise a long history mid-rollout and go on from the summary. TRL drops opencode's
summary calls; rLLM turns compaction off; here the summary call and the calls after it stay in
the rollout. Each agent CLI runs against the scripted engine (harness/audit/scripted_engine.py)
through the capture proxy, configured by its own Harness agent class with a small
`context_window` (harness/service/agents: opencode's model `limit`, Codex's
`model_context_window` / `model_auto_compact_token_limit`, Claude Code's
`CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`). The replies, chosen: shell calls whose output is long (`seq`)
until the agent asks for a summary; the summary (it carries MARK); after it, one short command
and the end. Checked for each agent:
  * compaction happened: a call asked for a summary, and later calls carry the summary;
  * the summary call is retained and tagged aux `summarizer` (loss mask all zero in the trace);
  * the first call after it is placed in the rollout (not `unplaced`), joined as `rewritten`
    (a compaction root), and the calls after it extend it;
  * every recorded id is the engine's;
  * rows: each surviving context window is its own row, and the trained tokens are the sampled
    tokens of the agent's own calls, each once (tests/helpers/rows_once.py); with
    `train_summary_calls` the summary's tokens train too, once.

mini-swe-agent never compacts (its history only grows until its step or cost limit), so it is
not here.

What a compaction looks like (measured here; join, aux reason, prompt ids):

    opencode     title new_root; turn new_root 9.7k; extended 13.2k; summarizer new_root 3.9k
                 (its own system prompt, the transcript as one user message, no tools);
                 rewritten 9.9k (task + summary + "Continue if you have next steps"); extended
    Codex        turn new_root 13.2k; extended 16.7k; summarizer new_root 13.9k (the history +
                 "CONTEXT CHECKPOINT COMPACTION", no tools); rewritten 13.4k ("Another language
                 model started to solve this problem ... summary"); extended
    Claude Code  turn new_root 21.1k; extended; extended 28.0k; summarizer branched 30.2k (the
                 history + "Respond with TEXT ONLY ... <summary> block", WITH its tools: the aux
                 rule reads that order, capture/aux.py); rewritten 25.0k ("This session is being
                 continued ... Summary:" + the block + the last messages kept verbatim); extended

A window below an agent's first prompt makes it compact before every call: Codex at 12k made
1,412 summary calls in 300 s (each post-compaction prompt was again over its limit).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from capture.aux import aux_hint
from harness.audit.scripted_engine import ScriptedEngine, shell_call
from tests.helpers.agent_cli import run_agent
from tests.helpers.rows_once import check_trained_once
from trainer.rows import trace_to_rows

pytestmark = [pytest.mark.agents, pytest.mark.slow]

POLICY = {"temperature": 1.0, "max_tokens": 256}
TASK = "List the numbers with seq a few times, then write done.txt."
MARK = "CHECKPOINT-7Q"
SUMMARY_TEXT = (f"{MARK}: the numbers were listed with seq several times and read; what is "
                "left is to write done.txt and finish.")
# As Claude Code asks (it re-asks once without the block, and carries only the block's text on);
# opencode and Codex carry the whole reply
SUMMARY = f"<analysis>Seq ran; done.txt is next.</analysis>\n<summary>\n{SUMMARY_TEXT}\n</summary>"
LONG = "seq 100000 100600"  # ~4.2k characters of output: the history grows fast
LAST = "echo done > done.txt"
FINAL = "done.txt is written; the task is finished."
MAX_LONG = 12  # long commands before the script gives up waiting for a compaction

# agent -> (its CLI name for launchers.paths.agent_bin, its dialect, the window told to it).
# The windows sit a few long outputs above each agent's first prompt with the tiny tokenizer
# (measured: opencode 9.7k tokens, Codex 13.1k, Claude Code ~21k; one `seq` output ~3.4k).
AGENTS = {"opencode": ("opencode", "chat", 16_000),
          "codex": ("codex", "responses", 17_000),
          "claude-code": ("claude", "messages", 28_000)}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict)
                        and isinstance(p.get("text"), str))
    return ""


def asks_for_summary(request: dict[str, Any]) -> bool:
    """The agent's compaction call: it ends on a user message (not a tool result), that message
    or the system prompt asks to summarise or compact (Codex and Claude Code append the request
    as a user message; opencode's summarizer has its own system prompt), and that message does
    not already carry the summary (the first call after the compaction ends on one that does)."""
    messages = request["messages"]
    last = messages[-1] if messages else {}
    if last.get("role") != "user" or MARK in _text(last.get("content")):
        return False
    hint = aux_hint(messages)
    return "summar" in hint or "compact" in hint


def compaction_task() -> Callable[[dict[str, Any]], str]:
    """Long shell outputs until the agent asks for a summary; then the summary; after it (the
    history carries MARK) the short command once and the end. A call without tools gets a title.
    Claude Code keeps the last messages before the compaction verbatim after the summary, so
    "once" is read from the assistant's calls, not from a count of tool results."""

    def script(request: dict[str, Any]) -> str:
        if asks_for_summary(request):
            return SUMMARY
        if not request.get("tools"):
            return "Listing numbers"
        messages = request["messages"]
        carried = [i for i, m in enumerate(messages) if MARK in _text(m.get("content"))]
        if carried:  # after the compaction
            ran_last = any(LAST in json.dumps(m.get("tool_calls") or [])
                           for m in messages[carried[-1]:] if m.get("role") == "assistant")
            return FINAL if ran_last else shell_call(request, LAST)
        step = sum(1 for m in messages if m.get("role") == "tool")
        return shell_call(request, LONG) if step < MAX_LONG else FINAL

    return script


@pytest.fixture
def scripted(tiny_model_path) -> Iterator[tuple[ScriptedEngine, Any]]:
    from capture import CaptureClient, CaptureServer

    with ScriptedEngine(tiny_model_path, compaction_task()) as engine, \
            CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        yield engine, admin


def run_compacting_agent(name: str, admin: Any, tmp_path: Path) -> tuple[Any, Path, str]:
    """The agent configured by its Harness class with a small context window, run to its end."""
    from harness.service.agents import get_agent
    from launchers.paths import agent_bin

    cli, dialect, window = AGENTS[name]
    try:
        agent_bin(cli)
    except Exception as exc:  # noqa: BLE001 - the message names ./setup.sh
        # ./setup.sh installs every agent: a missing one is a set-up defect, not a reason to skip.
        pytest.fail(f"{cli} is not installed here ({exc}); ./setup.sh installs it")
    info = admin.create_session(sampling=POLICY)
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    agent = get_agent(name)(tmp_path / "logs", model_name="tiny", base_url=info.base_urls[dialect],
                            api_key=info.secret, max_steps=20, context_window=window)
    agent.home = str(home)
    for relative, text in agent.config_files().items():
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    output = run_agent(agent.command(TASK), home, work, agent.full_env())
    return info, work, output


def describe(turns: list[dict]) -> list[tuple[str, str | None, int, int]]:
    """(join, aux_reason, prompt ids, completion ids) per call: what a compaction looks like."""
    return [(t["metadata"]["join"], t["metadata"]["aux_reason"], len(t["prompt_token_ids"]),
             len(t["completion_token_ids"])) for t in turns]


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_an_agent_that_compacts_keeps_its_summary_call_and_the_calls_after_it_in_the_rollout(
        agent: str, scripted, tmp_path: Path) -> None:
    engine, admin = scripted
    info, work, output = run_compacting_agent(agent, admin, tmp_path)
    assert not engine.errors, f"the script failed: {engine.errors!r}\n{output}"
    summary_requests = [r for r in engine.requests if asks_for_summary(r)]
    assert summary_requests, f"{agent} never compacted (no summary request):\n{output}"
    assert (work / "done.txt").is_file(), f"{agent} did not go on after compacting:\n{output}"
    trace = json.loads(admin.trace_json(info.session_id))
    turns = trace["turns"]
    (tmp_path / "trace.json").write_text(json.dumps(trace))  # kept by pytest for a post-mortem
    print(f"\n{agent}: {describe(turns)}\n{admin.stats(info.session_id)['joins']}\n"
          f"{[(r['messages'][-1].get('role'), _text(r['messages'][-1].get('content'))[:80])
              for r in engine.requests]}\n{tmp_path}")
    for turn in turns:  # every recorded id is the engine's
        sent = [r for r in engine.requests if engine.prompt_ids(r) == turn["prompt_token_ids"]]
        assert sent, f"{turn['node_id']}: a prompt the engine never rendered"
        reply = engine.replies[engine.requests.index(sent[-1])]
        assert turn["completion_token_ids"] == engine.completion_ids(reply)
    summary = engine.completion_ids(SUMMARY)
    summarizers = [t for t in turns if t["completion_token_ids"] == summary]
    assert summarizers, "the summary call is not in the trace"
    for turn in summarizers:
        assert turn["metadata"]["aux_reason"] == "summarizer", describe(turns)
        assert not any(turn["loss_mask"])
    after = turns.index(summarizers[-1]) + 1
    later = turns[after:]
    assert later, "no call after the summary"
    carrying = [t for t in later if MARK in engine.tokenizer.decode(t["prompt_token_ids"])]
    assert carrying and carrying[0]["metadata"]["join"] == "rewritten", describe(turns)
    assert not any(t["metadata"]["unplaced"] for t in turns), describe(turns)
    assert all(t["metadata"]["join"] == "extended" for t in carrying[1:]), describe(turns)
    # rows: the context windows before and after the compaction are separate rows; each sampled
    # token of the agent's calls trains once, the summary is context
    rows = check_trained_once(trace)
    root = carrying[0]["node_id"]
    (after_row,) = [row for row in rows if root in row.node_ids]
    assert after_row.node_ids[0] == root  # the window after the compaction starts its own row
    assert all(t["node_id"] in after_row.node_ids for t in carrying)
    # with the setting on, the summary's sampled tokens train too, each once
    trained, _ = trace_to_rows(trace, rollout_id="r", train_summary_calls=True)
    off = sum(row.n_trainable for row in rows)
    assert sum(row.n_trainable for row in trained) == off + len(summary) * len(summarizers)
