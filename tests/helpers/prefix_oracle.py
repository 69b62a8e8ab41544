"""The rollout graph's parent rule, written the slow, obvious way, for tests to compare against.

A call's parent is the earlier call whose prompt + completion is the longest prefix of the call's
prompt, among those whose prompt is shorter (the same prompt again is a retry: a sibling). Equal
lengths go to the oldest. O(calls x prompt): fine for tests, never for the proxy.
"""

from __future__ import annotations

from collections.abc import Iterable


def oracle_parent(prompt: list[int], earlier: Iterable[tuple[str, list[int], list[int]]]
                  ) -> str | None:
    """`earlier`: (node_id, prompt ids, completion ids) in arrival order."""
    best, best_len = None, -1
    for node_id, other_prompt, completion in earlier:
        end = other_prompt + completion
        if (len(other_prompt) < len(prompt) and len(end) <= len(prompt)
                and prompt[: len(end)] == end and len(end) > best_len):
            best, best_len = node_id, len(end)
    return best


def turn_parent(turn: dict, earlier: list[dict]) -> str | None:
    """The oracle's parent of an exported TrainingTrace turn (dicts, as `trace_json` writes)."""
    return oracle_parent(turn["prompt_token_ids"], (
        (t["node_id"], t["prompt_token_ids"], t["completion_token_ids"]) for t in earlier))
