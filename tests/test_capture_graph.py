"""Rollout graph, aux tagging and sampling policy, as pure units (no HTTP, no engine).

Run: .venv/bin/python -m pytest tests/test_capture_graph.py -q
"""

from __future__ import annotations

from array import array

import pytest

from capture.aux import aux_hint, classify
from capture.graph import HOT_LEAVES, RolloutGraph
from capture.sampling import SamplingPolicy
from tests.helpers.prefix_oracle import oracle_parent


def _add(graph: RolloutGraph, node_id: str, prompt: list[int], completion: list[int]):
    return graph.add(node_id, prompt, completion, [-0.5] * len(completion))


def test_a_call_whose_prompt_extends_an_earlier_prompt_plus_completion_is_its_child():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2, 3], [4, 5])
    # prompt = a.prompt + a.completion + [6, 7] (a tool result)
    b = _add(graph, "b", [1, 2, 3, 4, 5, 6, 7], [8])
    assert b.parent_id == "a"
    assert list(b.seg) == [6, 7]  # only the new tokens are stored


def test_the_longest_matching_ancestor_is_the_parent_not_an_earlier_one():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2], [3])
    _add(graph, "b", [1, 2, 3, 4], [5])
    c = _add(graph, "c", [1, 2, 3, 4, 5, 6], [7])
    assert c.parent_id == "b"


def test_a_rewritten_history_starts_a_new_root():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2, 3], [4, 5])
    # the agent compacted its history: the prompt no longer starts with a's tokens
    b = _add(graph, "b", [1, 9, 3, 4, 5, 6], [7])
    assert b.parent_id is None
    assert [n.node_id for n in graph.roots] == ["a", "b"]


def test_a_prompt_that_diverges_inside_the_parent_completion_is_not_its_child():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2, 3], [4, 5])
    # 1,2,3 then 4 then 6: the agent edited the reply it got
    b = _add(graph, "b", [1, 2, 3, 4, 6, 7], [8])
    assert b.parent_id is None


def test_a_retry_that_was_continued_is_kept_and_its_sibling_discarded():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2], [3])
    _add(graph, "r1", [1, 2, 3, 4], [5])  # first attempt
    _add(graph, "r2", [1, 2, 3, 4], [6])  # same prompt again: a retry
    _add(graph, "c", [1, 2, 3, 4, 5, 7], [8])  # the agent continued r1
    assert graph.discarded() == {"r2": "retry_not_continued"}


def test_when_no_retry_was_continued_only_the_newest_is_kept():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2], [3])
    _add(graph, "b", [1, 2], [4])
    assert graph.discarded() == {"a": "retry_not_continued"}


def test_parent_lookup_works_when_the_parent_is_no_longer_a_hot_leaf():
    graph = RolloutGraph()
    _add(graph, "main", [1, 2], [3])
    # more side conversations than there are hot slots push "main" out of the hot set
    for i in range(HOT_LEAVES + 2):
        _add(graph, f"side{i}", [100 + i, 7], [8])
    child = _add(graph, "next", [1, 2, 3, 4], [5])
    assert child.parent_id == "main"


def test_a_late_retry_that_sampled_less_is_not_the_parent_of_the_original_continuation():
    """The hot path finds the retry (hot, and its shorter end is a prefix of the continuation);
    the original, pushed out of the hot set by side calls, ends further: it must be re-checked."""
    graph = RolloutGraph()
    _add(graph, "orig", [1, 2], [3, 4])
    for i in range(HOT_LEAVES + 1):  # side calls push "orig" out of the hot set
        _add(graph, f"side{i}", [100 + i, 7], [8])
    retry = _add(graph, "retry", [1, 2], [3])  # the same call again; it sampled a prefix
    assert retry.parent_id is None
    cont = _add(graph, "cont", [1, 2, 3, 4, 5], [6])  # continues the ORIGINAL answer
    assert cont.parent_id == "orig"
    assert oracle_parent([1, 2, 3, 4, 5], [(n.node_id, n.prompt_ids().tolist(),
                                            n.completion.tolist()) for n in graph if n is not cont]
                         ) == "orig"


def test_each_node_stores_only_new_tokens_so_storage_grows_with_the_conversation():
    graph = RolloutGraph()
    prompt = list(range(1, 4001))  # a 4k-token system prompt
    for turn in range(150):
        completion = [10_000 + turn]
        node = _add(graph, f"t{turn}", prompt, completion)
        prompt = prompt + completion + [20_000 + turn]  # tool result
    # 150 turns of a growing prompt: stored ids = first prompt + 2 ids per turn, not 150 prompts
    assert graph.stats()["n_tokens_stored"] == 4000 + 150 + 149
    assert node.parent_id == "t148"
    assert node.prompt_ids().tolist() == prompt[: node.prompt_len]


def test_prompt_ids_are_rebuilt_exactly_from_the_path():
    graph = RolloutGraph()
    _add(graph, "a", [5, 6], [7])
    b = _add(graph, "b", [5, 6, 7, 8, 9], [10, 11])
    c = _add(graph, "c", [5, 6, 7, 8, 9, 10, 11, 12], [13])
    assert c.prompt_ids() == array("i", [5, 6, 7, 8, 9, 10, 11, 12])
    assert [n.node_id for n in c.path()] == ["a", "b", "c"] and b.children == [c]


def test_a_toolless_call_in_a_tool_using_session_is_aux():
    infos = [{"n_tools": 10, "hint": ""}, {"n_tools": 0, "hint": "you are helpful"}]
    assert classify(infos) == [None, "no_tools_in_tool_session"]


def test_a_title_generator_is_tagged_by_its_prompt():
    hint = aux_hint([{"role": "system", "content": "You are a title generator."},
                     {"role": "user", "content": "fix the bug"}])
    assert classify([{"n_tools": 0, "hint": hint}, {"n_tools": 3, "hint": ""}]) == [
        "title_generator", None]


def test_a_one_token_call_is_a_count_probe_even_with_tools():
    assert classify([{"n_tools": 24, "max_tokens_requested": 1, "hint": "quota"}]) == [
        "count_probe"]


def test_a_session_that_never_sends_tools_has_no_structural_aux():
    assert classify([{"n_tools": 0, "hint": "solve it"}] * 3) == [None, None, None]


def test_a_summariser_is_tagged_as_such():
    hint = aux_hint([{"role": "user", "content": "Summarize the conversation so far"}])
    assert classify([{"n_tools": 0, "hint": hint}, {"n_tools": 1, "hint": ""}])[0] == "summarizer"


def test_the_sampling_policy_overrides_the_agent_and_records_what_it_changed():
    policy = SamplingPolicy.from_dict({"temperature": 0.8, "top_k": 0, "max_tokens": 100})
    chat = {"temperature": 0.2, "top_p": 0.9, "max_tokens": 4000, "messages": []}
    enforced = policy.enforce(chat)
    assert (chat["temperature"], chat["top_p"], chat["top_k"], chat["max_tokens"]) == (
        0.8, 1.0, -1, 100)
    assert enforced["overridden"] == {"temperature": 0.2, "top_p": 0.9}
    assert enforced["max_tokens"] == {"requested": 4000, "sent": 100}


def test_a_smaller_agent_max_tokens_is_kept_under_the_cap():
    policy = SamplingPolicy.from_dict({"temperature": 1.0, "max_tokens": 100})
    chat = {"max_completion_tokens": 7}
    assert policy.enforce(chat)["max_tokens"] == {"requested": 7, "sent": 7}
    assert chat["max_tokens"] == 7 and "max_completion_tokens" not in chat


def test_no_policy_means_the_neutral_training_policy():
    chat = {"top_p": 0.95, "presence_penalty": 1.0}
    SamplingPolicy.from_dict(None).enforce(chat)
    assert chat["top_p"] == 1.0 and chat["presence_penalty"] == 0.0 and chat["temperature"] == 1.0


@pytest.mark.parametrize("bad", [{"temperature": "hot"}, {"top_p": 2}, {"nucleus": 1},
                                 {"max_tokens": 0}, {"temperature": float("nan")}, [1]])
def test_an_invalid_sampling_policy_is_refused_with_the_field_named(bad):
    with pytest.raises(ValueError):
        SamplingPolicy.from_dict(bad)


def test_id_text_prefixes_respect_token_boundaries():
    graph = RolloutGraph()
    _add(graph, "a", [12], [3])  # whole text b"12,3"
    # b"12,34,5" starts with b"12,3" as text, but its second id is 34, not 3
    b = _add(graph, "b", [12, 34, 5], [6])
    assert b.parent_id is None


def test_prompt_ids_are_cut_from_the_raw_reply_and_the_rest_parses_without_them():
    from capture.tokens import split_prompt_ids
    from capture.upstream import loads

    raw = b'{"choices":[{"message":{"content":"\\"prompt_token_ids\\": [9]"}}],' \
          b'"prompt_token_ids": [1, 2, 30],"usage":{}}'
    stripped, ids = split_prompt_ids(raw)
    assert ids.ids().tolist() == [1, 2, 30] and ids.n == 3
    assert loads(stripped)["prompt_token_ids"] is None
    assert loads(stripped)["choices"][0]["message"]["content"] == '"prompt_token_ids": [9]'


def test_a_nested_prompt_token_ids_key_before_the_top_level_one_is_read_the_certain_way():
    """The shortcut cuts the FIRST `"prompt_token_ids": [...]`; here that is a nested one (inside
    a choice), so the reply must be parsed whole and the top-level ids taken, never the nested."""
    from capture.upstream import _parse_reply

    raw = (b'{"choices":[{"message":{"content":"hi"},"prompt_token_ids": [9]}],'
           b'"prompt_token_ids": [1, 2, 30],"usage":{}}')
    reply, text = _parse_reply(raw)
    ids = text.ids().tolist() if text is not None else reply["prompt_token_ids"]
    assert ids == [1, 2, 30]
    assert reply["choices"][0]["prompt_token_ids"] == [9]  # the nested list left as sent
    # and the usual reply (top-level key first) still takes the shortcut
    reply, text = _parse_reply(b'{"prompt_token_ids":[4,5],"choices":[]}')
    assert reply["prompt_token_ids"] is None and text.ids().tolist() == [4, 5]


@pytest.mark.parametrize("text", [b"-5,6", b"1,2,x", b"1,2.5", b"1,99999999999"])
def test_prompt_ids_that_are_not_token_ids_are_refused_on_a_new_root(text):
    from capture.tokens import IdText

    with pytest.raises((ValueError, TypeError, OverflowError)):
        RolloutGraph().add("a", IdText(text), [1], [-0.5])


@pytest.mark.parametrize("tail", [b",-7", b',"x"', b",1.5"])
def test_new_prompt_ids_after_a_hot_parent_are_checked_too(tail):
    from capture.tokens import IdText

    graph = RolloutGraph()
    graph.add("a", IdText(b"1,2"), [3], [-0.5])
    with pytest.raises((ValueError, TypeError, OverflowError)):
        graph.add("b", IdText(b"1,2,3" + tail), [4], [-0.5])
    assert len(graph) == 1  # nothing half-added


def test_a_retry_of_a_call_that_sampled_nothing_is_its_sibling_not_its_child():
    graph = RolloutGraph()
    _add(graph, "a", [1, 2, 3], [])
    again = _add(graph, "b", [1, 2, 3], [4])
    assert again.parent_id is None  # same prompt: a retry (a second root), not a continuation
    child = _add(graph, "c", [1, 2, 3, 4, 5], [6])
    assert child.parent_id == "b"


@pytest.mark.parametrize("seed", range(6))
def test_parents_match_a_brute_force_oracle_over_random_sessions(seed):
    """Continues, retries (also late ones, after more side calls than hot slots, followed by a
    continuation of the original), branches off old turns, interleaved conversations, rewrites:
    every parent is the oracle's longest prefix, whichever path (hot leaf, hot parent, full descent)
    the graph took to find it."""
    import random

    from capture.tokens import IdText

    rng = random.Random(seed)
    graph = RolloutGraph()
    ends: list[tuple[str, list[int]]] = []  # (node_id, prompt + completion)
    prompts: list[list[int]] = []
    scripted: list[tuple[list[int], list[int]]] = []  # queued (prompt, completion) calls
    for i in range(120):
        action = rng.random()
        completion = None
        if scripted:
            prompt, completion = scripted.pop(0)
        elif ends and action < 0.06:
            # A retry of an old call after more side calls than there are hot slots, answered
            # with a prefix of the original's answer, then a continuation of the ORIGINAL: the
            # hot path meets the retry first; the original must still win (it ends further).
            old_id, old_end = rng.choice(ends)
            old = graph.nodes[old_id]
            old_prompt, old_completion = old_end[: old.prompt_len], old_end[old.prompt_len:]
            side = [([200 + rng.randrange(50), i, k], [rng.randrange(1, 50)])
                    for k in range(HOT_LEAVES + rng.randrange(1, 4))]
            cut = rng.randrange(0, len(old_completion))
            # a retry that sampled nothing is its own case (same prompt again); keep one token
            retry_completion = old_completion[: max(cut, 1)] if len(old_completion) > 1 else [49]
            scripted = side + [(old_prompt, retry_completion),
                               (old_end + [rng.randrange(1, 50)], [rng.randrange(1, 50)])]
            prompt, completion = scripted.pop(0)
        elif not ends or action < 0.1:  # a new conversation (or a rewritten history)
            prompt = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 6))]
        elif action < 0.6:  # the next turn of the newest conversation
            prompt = ends[-1][1] + [rng.randrange(1, 50) for _ in range(rng.randrange(0, 4))]
        elif action < 0.75:  # a retry of a recent call
            prompt = list(prompts[-rng.randrange(1, min(4, len(prompts)) + 1)])
        else:  # a branch off any earlier turn (a subagent, an agent going back)
            prompt = rng.choice(ends)[1] + [rng.randrange(1, 50) for _ in range(rng.randrange(1, 4))]
        # an engine samples at least one token (an immediate stop is its stop token)
        if completion is None:
            completion = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 4))]
        node = graph.add(f"n{i}", IdText.from_ids(prompt), completion, [-0.5] * len(completion))
        earlier = [(n.node_id, n.prompt_ids().tolist(), n.completion.tolist())
                   for n in graph.nodes.values() if n is not node]
        assert node.parent_id == oracle_parent(prompt, earlier), (i, prompt)
        assert node.prompt_ids().tolist() == prompt
        ends.append((node.node_id, prompt + completion))
        prompts.append(prompt)


def test_a_linear_session_and_its_retries_never_reparse_the_history(monkeypatch):
    """The usual calls (the next turn; a retry of the last one) take the hot path: the prompt is
    matched as text and only its new ids are parsed, never the whole prompt."""
    from capture import tokens
    from capture.tokens import IdText

    graph = RolloutGraph()
    prompt = list(range(1000, 1500))
    graph.add("root", IdText.from_ids(prompt), [7, 8], [-0.5, -0.5])
    parsed: list[int] = []
    real_parse = tokens.parse_ids
    monkeypatch.setattr(tokens, "parse_ids", lambda text: parsed.append(
        text.count(b",") + 1) or real_parse(text))
    end = prompt + [7, 8]
    for turn in range(30):
        prompt = end + [2000 + turn, 2001 + turn]
        node = graph.add(f"t{turn}", IdText.from_ids(prompt), [9], [-0.5])
        if turn % 5 == 4:  # the agent retries the call it just made
            retry = graph.add(f"r{turn}", IdText.from_ids(prompt), [10], [-0.5])
            assert retry.parent_id == node.parent_id
        end = prompt + [9]
    assert max(parsed) <= 3  # only new ids were ever parsed (2 new + at most 1 completion)


def test_a_compaction_request_sent_with_tools_is_a_summarizer_only_after_the_agent_worked():
    # Claude Code 2.1 sends its compaction request with its whole tool manifest (measured,
    # tests/test_compaction_agents.py); its last user message orders text only and a summary
    order = aux_hint([{"role": "user", "content": "CRITICAL: Respond with TEXT ONLY. Do NOT call "
                       "any tools.\n- Your entire response must be plain text: an <analysis> "
                       "block followed by a <summary> block."}])
    task = aux_hint([{"role": "user", "content": "Summarize app.log. Do not call any tools you "
                      "do not need; respond with text only."}])
    plain = aux_hint([{"role": "user", "content": "Summarize app.log into summary.txt."}])
    compacted = {"continued": False, "history_restarts_later": True}
    assert classify([{"n_tools": 24, "hint": order, **compacted}]) == [None]  # the first call
    assert classify([{"n_tools": 24, "hint": task, "continued": True},
                     {"n_tools": 24, "hint": order, **compacted}]) == [None, "summarizer"]
    assert classify([{"n_tools": 24, "hint": plain, "continued": True},
                     {"n_tools": 24, "hint": plain, **compacted}]) == [
        None, None]  # a summary word without a no-tools order is the agent's turn


def test_words_the_policy_can_put_in_a_call_never_leave_that_call_untrained():
    # A command's output that reads like a compaction order (a user message: mini-swe-agent's
    # format errors and text-mode observations), or a task worded like one, which stays the last
    # user message of every later call: the agent went on from each call, so each trains.
    order = aux_hint([{"role": "system", "content": "You are a coding agent."},
                      {"role": "user", "content": "CRITICAL: Respond with TEXT ONLY. Do NOT call "
                       "any tools. Summarize the conversation in a <summary> block."}])
    went_on = {"continued": True, "history_restarts_later": False}
    assert classify([{"n_tools": 1, "hint": "", **went_on}] +
                    [{"n_tools": 1, "hint": order, **went_on}] * 3) == [None] * 4
    # the last call of a session (nothing after it) is not a compaction either
    assert classify([{"n_tools": 1, "hint": "", "continued": True},
                     {"n_tools": 1, "hint": order, "continued": False,
                      "history_restarts_later": False}]) == [None, None]
    # a session that never sends tools (an agent that parses calls out of text): a "title" or
    # "summarize" in the last user message is an observation, not the harness asking
    said = aux_hint([{"role": "system", "content": "Reply with one shell command."},
                     {"role": "user", "content": "title: summarize the report"}])
    assert classify([{"n_tools": 0, "hint": said, **went_on}] * 2) == [None, None]
    titled = aux_hint([{"role": "system", "content": "You are a title generator."},
                       {"role": "user", "content": "fix the bug"}])
    assert classify([{"n_tools": 0, "hint": titled}]) == ["title_generator"]
    compacted = {"continued": False, "history_restarts_later": True}
    summary = aux_hint([{"role": "user", "content": "Summarize the conversation so far."}])
    assert classify([{"n_tools": 0, "hint": said, "continued": True},
                     {"n_tools": 0, "hint": summary, **compacted},
                     {"n_tools": 0, "hint": said}]) == [None, "summarizer", None]


