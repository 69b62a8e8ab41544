"""One rollout's TrainingTrace as the page shows it: a graph of turns, each with its tokens.

The capture proxy links engine calls into a graph (capture/graph.py): a call whose prompt extends
an earlier call's prompt + reply is that call's child. An agent that rewrites its history
(compaction, a summary, an edited transcript, a retry from an earlier point) makes a second child
of an earlier node or a new root: that is a *branch*. Here each turn gets

    branch      0 for the first line of the conversation; a new number for each later child of a
                node that already had one, and for each new root after the first
    forks_from  the turn index it branched from (None: it continues its parent, or it is a root)
    depth       how many ancestors it has
    compacted_by  where the agent compacted its history: on the first call after a compaction
                the index of the summarizer call (capture.aux) whose summary its prompt carries
                (the capture joins that call as `rewritten`, capture.placement); else None

and its tokens as [id, text, logprob, mask]: the completion (what the engine sampled) with the
loss mask the trainer uses (1 = trained, 0 = masked: aux calls, tokens without a usable logprob),
and the prompt tokens this call added after its parent (always masked, mask 0). `text` is None
when no tokenizer was found (the page then shows the ids).
"""

from __future__ import annotations

import math
from typing import Any

from capture.placement import summary_body

__all__ = ["turns_view"]


def _turn_id(turn: dict[str, Any]) -> Any:
    return turn.get("node_id") if turn.get("node_id") is not None else \
        (turn.get("metadata") or {}).get("node_id")


def _tokens(ids: list[int], logps: list[float] | None, mask: list[int],
            tokenizer: Any) -> list[list[Any]]:
    out = []
    for i, token_id in enumerate(ids):
        logp = logps[i] if logps is not None and i < len(logps) else None
        if logp is not None and not math.isfinite(logp):
            logp = None
        text = tokenizer.text(token_id) if tokenizer is not None else None
        out.append([token_id, text, logp, mask[i] if i < len(mask) else 0])
    return out


def _reply(response: dict[str, Any]) -> dict[str, Any] | None:
    if isinstance(response.get("message"), dict):  # older captured shape
        return response["message"]
    choices = response.get("choices") or []
    if choices and isinstance(choices[0], dict):
        return choices[0].get("message")
    return None


def _new_messages(request: dict[str, Any], is_first: bool) -> list[dict[str, Any]]:
    """What this call added to the conversation (the proxy's `new_messages`)."""
    if "new_messages" in request:
        return list(request.get("new_messages") or [])
    if is_first:  # foreign traces: the whole request is the first turn's news
        return list(request.get("messages") or request.get("input") or [])
    return []


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(part.get("text", "") for part in content
                        if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


# What of a summary must reappear in a later prompt to call that prompt its compaction (the same
# evidence capture.placement accepts: the summary's first 160 characters, 40 at least)
_SUMMARY_HEAD, _MIN_SUMMARY = 160, 40


def _compacted_by(view: dict[str, Any], summaries: list[tuple[int, str]]) -> int | None:
    """The latest summarizer call whose summary this rewritten root's messages carry."""
    if view["join"] != "rewritten" or not summaries:
        return None
    texts = [_text(m.get("content")) for m in view["new_messages"] if isinstance(m, dict)]
    for index, summary in reversed(summaries):
        if any(summary[:_SUMMARY_HEAD] in text for text in texts):
            return index
    return None


def turns_view(turns: list[dict[str, Any]], tokenizer: Any = None) -> list[dict[str, Any]]:
    """Each turn of a trace, in arrival order, ready for the page (see the module docstring)."""
    index_of: dict[Any, int] = {}
    children: dict[Any, int] = {}
    branch_of: list[int] = []
    next_branch = 0
    out = []
    summaries: list[tuple[int, str]] = []  # (turn index, summary text) of summarizer calls
    for i, turn in enumerate(turns):
        metadata = dict(turn.get("metadata") or {})
        node_id = _turn_id(turn)
        parent = metadata.get("parent_id")
        parent_index = index_of.get(parent)
        forks_from = None
        if parent_index is None:  # a root: the first, or a history matching no earlier call
            branch = next_branch if i else 0
            next_branch += 1
            forks_from = None if i == 0 else -1
        elif children.get(parent, 0) == 0:
            branch = branch_of[parent_index]
        else:  # a second child of the same node: the history was rewritten from that point
            branch = next_branch
            next_branch += 1
            forks_from = parent_index
        children[parent] = children.get(parent, 0) + 1
        index_of[node_id] = i
        branch_of.append(branch)
        prompt = list(turn.get("prompt_token_ids") or [])
        completion = list(turn.get("completion_token_ids") or [])
        mask = list(turn.get("loss_mask") or [])
        completion_mask = mask[len(prompt):] if len(mask) == len(prompt) + len(completion) \
            else mask[-len(completion):] if completion else []
        n_new = metadata.get("n_new_prompt_tokens")
        if not isinstance(n_new, int) or n_new < 0 or n_new > len(prompt):
            # Not recorded: the part after the parent's prompt + reply, when it extends them.
            n_new = len(prompt)
            if parent_index is not None:
                p = turns[parent_index]
                base = list(p.get("prompt_token_ids") or []) + list(p.get("completion_token_ids") or [])
                if prompt[:len(base)] == base:
                    n_new = len(prompt) - len(base)
        new_prompt = prompt[len(prompt) - n_new:]
        request = turn.get("request") or {}
        out.append({
            "i": i, "node_id": node_id, "parent": parent_index, "depth": 0 if parent_index is None
            else out[parent_index]["depth"] + 1, "branch": branch, "forks_from": forks_from,
            "aux": bool(metadata.get("aux")), "aux_reason": metadata.get("aux_reason"),
            # how the capture joined it (capture.placement: extended, branched, rewritten,
            # new_root); None in traces recorded before the field
            "join": metadata.get("join"),
            "dialect": metadata.get("dialect"), "finish_reason": metadata.get("finish_reason"),
            "weight_version": [metadata.get("weight_version_start"),
                               metadata.get("weight_version_end")],
            "latency_s": metadata.get("latency_s"),
            "masked_logprobs": metadata.get("masked_logprobs") or {},
            "n_prompt_tokens": len(prompt),
            "n_completion_tokens": len(completion),
            "n_trained": sum(1 for m in completion_mask if m),
            "new_messages": _new_messages(request, i == 0),
            "reply": _reply(turn.get("response") or {}),
            "prompt_new_tokens": _tokens(new_prompt, None, [0] * len(new_prompt), tokenizer),
            "tokens": _tokens(completion, turn.get("per_token_logps"), completion_mask,
                              tokenizer),
        })
        out[-1]["compacted_by"] = _compacted_by(out[-1], summaries)
        summary = summary_body(_text((out[-1]["reply"] or {}).get("content")))
        if out[-1]["aux_reason"] == "summarizer" and len(summary) >= _MIN_SUMMARY:
            summaries.append((i, summary))
    return out
