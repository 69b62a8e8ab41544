"""Session -> `openenv.core.harness.training.TrainingTrace` (schema 1), as JSON.

One turn per retained engine call, in arrival order:

    prompt_token_ids      the engine's prompt ids (rebuilt from the path: ancestors' new tokens and
                          completions, then this call's new tokens; never re-tokenized)
    completion_token_ids  the sampled ids
    per_token_logps       the engine's processed logprob per sampled id (0.0 where it gave none)
    loss_mask             prompt positions 0; sampled tokens 1, except 0 for tokens without a usable
                          logprob (reason counted in metadata.masked_logprobs) and for aux calls
    request               `new_messages`: the chat-form messages this call added after its parent
                          (each message is stored once, not once per later turn), `n_messages`,
                          the tool names and tool_choice; and on the last turn of each
                          conversation (no retained child) `messages`, the whole chat-form request,
                          which is what OpenEnv's and TRL's readers take as the transcript
    response              OpenAI's shape, `choices[0].message` / `finish_reason`, whatever the
                          agent's dialect (the engine's reply in chat form)
    metadata              dialect, aux, aux_reason, parent_id, weight_version_start/end, latency_s,
                          session_id, finish_reason, sampling, + node_index, stream, usage,
                          masked_logprobs, engine_model (a LoRA run's adapter, else null);
                          `truncated` (the reply hit a token limit) and
                          `truncated_by` ("proxy_cap": the session's max_tokens cap cut it;
                          "agent_max_tokens": the agent's own limit; "context": the engine's
                          context length); `dropped_fields` (capture.allowlist); `unplaced`
                          (capture.placement); `rollout_caps` (capture.caps: limits, used,
                          calls refused past them); `join` (capture.placement: extended,
                          branched, rewritten, new_root)

Not retained (counted in stats and in the 409 reasons, never silently dropped): failed calls (an
upstream error: never trainable) and retries nobody continued (graph.RolloutGraph.discarded).
Aux calls ARE retained with an all-zero mask: they are real context and usage, just not credit.

Speed: a 150-turn session whose history reaches 41k tokens exports ~3.5M prompt ids (~27 MB).
Built as pydantic objects that takes seconds (OpenEnv's export blocked its proxy 1.5 s), so the
JSON is assembled from per-node id texts (each node's new ids formatted once, most of them cut
from the engine's reply as text when the call was recorded) and slices of one buffer of zeros,
joined once, and streamed in ~1 MB pieces from an async generator that lets other sessions' calls
run between pieces: ~40 ms of CPU for that session (bench/capture).

WHAT THIS MODULE CANNOT FILL IN: the reward. Scoring is the task verifier's job (the harness);
a capture proxy that invented a number would be worse than one that leaves it out. And it never
returns an empty trace: a session with nothing trainable raises NothingTrainableError with why.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from .aux import classify
from .errors import NothingTrainableError
from .graph import Node
from .placement import join_counts, join_kinds, unplaced_nodes
from .sessions import Session
from .upstream import dumps

__all__ = ["ExportPlan", "iter_trace_json", "iter_turn_json", "plan_export", "trace_json"]


@dataclass
class ExportPlan:
    """What an export will contain, decided before any JSON is written."""

    session: Session
    turns: list[tuple[Node, str | None]]  # retained nodes with their aux reason
    discarded: dict[str, str]
    trainable_tokens: int
    reasons: list[str] = field(default_factory=list)  # why nothing is trainable (when so)
    unplaced: set[str] = field(default_factory=set)  # capture.placement
    joins: dict[str, str] = field(default_factory=dict)  # node_id -> capture.placement JOINS

    def stats(self) -> dict[str, Any]:
        aux: dict[str, int] = {}
        for _, reason in self.turns:
            if reason is not None:
                aux[reason] = aux.get(reason, 0) + 1
        failed: dict[str, int] = {}
        for entry in self.session.failed:
            failed[entry["cause"]] = failed.get(entry["cause"], 0) + 1
        return {
            "n_retained_turns": len(self.turns),
            "n_trainable_tokens": self.trainable_tokens,
            "aux": aux,
            "discarded": len(self.discarded),
            "unplaced": len(self.unplaced),
            # how the retained calls joined the graph (capture.placement): extended, branched,
            # rewritten (a rewritten-history root), new_root
            "joins": join_counts(self.joins),
            "failed": failed,
        }


def _with_structure(retained: list[Node]) -> list[dict]:
    """Each call's info plus what only the agent decides (capture.aux): whether a later retained
    call continued from it, and whether a later retained call started a new history."""
    ids = {node.node_id for node in retained}
    roots_after = [False] * len(retained)
    seen_root = False
    for i in range(len(retained) - 1, -1, -1):
        roots_after[i] = seen_root
        seen_root = seen_root or retained[i].parent is None
    return [{**node.info, "continued": any(c.node_id in ids for c in node.children),
             "history_restarts_later": later}
            for node, later in zip(retained, roots_after, strict=True)]


def plan_export(session: Session) -> ExportPlan:
    """Choose retained turns, tag aux calls and count trainable tokens. Cheap: no token copies."""
    nodes = list(session.graph)
    discarded = session.graph.discarded()
    retained = [node for node in nodes if node.node_id not in discarded]
    reasons_aux = classify(_with_structure(retained))
    trainable = 0
    missing: dict[str, int] = {}
    empty = 0
    for node, reason in zip(retained, reasons_aux, strict=True):
        if not node.completion:
            empty += 1
        for why, count in node.info.get("masked_logprobs", {}).items():
            missing[why] = missing.get(why, 0) + count
        if reason is None:
            trainable += sum(1 for x in node.logprobs if not math.isnan(x))
    plan = ExportPlan(session, list(zip(retained, reasons_aux, strict=True)), discarded,
                      trainable)
    plan.unplaced = unplaced_nodes(plan.turns)
    plan.joins = join_kinds(plan.turns, plan.unplaced)
    if trainable == 0:
        plan.reasons = _why_nothing(session, plan, missing, empty)
    return plan


def _why_nothing(session: Session, plan: ExportPlan, missing: dict[str, int],
                 empty: int) -> list[str]:
    stats = plan.stats()
    reasons = []
    if not session.graph and not session.failed:
        reasons.append(
            "no engine call was recorded: the agent never reached this session (check its base "
            "URL and that it sends the session secret as its API key)"
        )
    if stats["failed"]:
        reasons.append(f"{len(session.failed)} call(s) failed upstream {stats['failed']}")
    if stats["aux"]:
        reasons.append(f"{sum(stats['aux'].values())} call(s) are auxiliary {stats['aux']}")
    if plan.discarded:
        reasons.append(f"{len(plan.discarded)} call(s) were retries nobody continued")
    if missing:
        reasons.append(f"completion tokens without a usable logprob {missing}")
    if empty:
        reasons.append(f"{empty} call(s) sampled no tokens")
    return reasons or ["no retained call has a trainable token"]


def _ids_bytes(values: Any) -> bytes:
    return ",".join(map(str, values)).encode()


def _then(pieces: list[bytes], text: bytes) -> list[bytes]:
    """Comma-separated id text as pieces: `pieces` (already separated) followed by `text`."""
    if not text:
        return pieces
    return [*pieces, b",", text] if pieces else [text]


def iter_turn_parts(plan: ExportPlan) -> Iterator[list[bytes | memoryview]]:
    """Each retained turn as the pieces of one JSON object, in arrival order.

    Nothing here copies a prompt: a turn's prompt is the list of its path's id texts (each node's
    new ids and completion, formatted once) and its prompt mask is a slice of one shared buffer of
    zeros. The caller joins the pieces once: per turn when streaming, all at once in memory.
    """
    paths: dict[str, list[bytes]] = {}  # node_id -> its prompt+completion texts, while needed
    waiting: dict[str, int] = {}  # node_id -> children not yet exported
    retained = {node.node_id for node, _ in plan.turns}
    longest = max((node.prompt_len for node, _ in plan.turns), default=0)
    zeros = memoryview(b"0," * longest)
    session_id = plan.session.session_id
    caps = plan.session.caps.stats(plan.session.n_calls)
    for node, aux_reason in plan.turns:
        parent = node.parent
        if parent is None:
            prefix: list[bytes] = []  # comma-separated pieces (`_then`)
        elif parent.node_id in paths:
            prefix = paths[parent.node_id]
            waiting[parent.node_id] -= 1
            if not waiting[parent.node_id]:
                del paths[parent.node_id], waiting[parent.node_id]
        else:  # parent not retained (cannot happen for a continued retry; kept for safety)
            prefix = _then(_then([], _ids_bytes(parent.prompt_ids())),
                           _ids_bytes(parent.completion))
        prompt = _then(prefix, node.seg_text())
        completion_text = _ids_bytes(node.completion)
        children = sum(1 for child in node.children if child.node_id in retained)
        if children:
            paths[node.node_id] = _then(prompt, completion_text)
            waiting[node.node_id] = children
        request = dict(node.info.get("request") or {})
        if not children:  # a conversation's last turn carries its whole transcript
            request["messages"] = full_messages(node)
        trainable = aux_reason is None
        mask = b",".join(b"1" if trainable and not math.isnan(x) else b"0" for x in node.logprobs)
        logps = [0.0 if math.isnan(x) else x for x in node.logprobs]
        info = node.info
        metadata = {
            "session_id": session_id,
            "dialect": info.get("dialect"),
            "aux": not trainable,
            "aux_reason": aux_reason,
            "parent_id": node.parent_id,
            "weight_version_start": info.get("weight_version_start"),
            "weight_version_end": info.get("weight_version_end"),
            # LoRA runs: the adapter (of weight_version_start) that sampled every token
            "engine_model": info.get("engine_model"),
            "latency_s": info.get("latency_s"),
            "finish_reason": info.get("finish_reason"),
            "sampling": info.get("sampling"),
            "node_index": node.index,
            "stream": info.get("stream"),
            "usage": info.get("usage"),
            "masked_logprobs": info.get("masked_logprobs", {}),
            "n_new_prompt_tokens": len(node.seg),
            # (a call logged before the flag existed: its finish reason says it)
            "truncated": info.get("truncated", info.get("finish_reason") == "length"),
            "truncated_by": info.get("truncated_by"),
            "dropped_fields": info.get("dropped_fields", []),
            # not in the agent's own conversation (capture.placement): the trainer leaves it out
            # unless told to train it (`train_unplaced_calls`)
            "unplaced": node.node_id in plan.unplaced,
            # how this call joined the graph (capture.placement JOINS)
            "join": plan.joins.get(node.node_id),
            "rollout_caps": caps,  # the session's (capture.caps), as of the export
        }
        yield [
            b'{"node_id":', dumps(node.node_id), b',"prompt_token_ids":[',
            *prompt,
            b'],"completion_token_ids":[', completion_text,
            b'],"per_token_logps":', dumps(logps),
            b',"loss_mask":[',
            *_then([zeros[:2 * node.prompt_len - 1]] if node.prompt_len else [], mask),
            b'],"request":', dumps(request),
            b',"response":', dumps(_chat_response(info.get("response") or {})),
            b',"metadata":', dumps(metadata),
            b"}",
        ]


def _chat_response(response: dict[str, Any]) -> dict[str, Any]:
    """The recorded reply in OpenAI's shape (older logs recorded `message` at the top)."""
    if "choices" in response or "message" not in response:
        return response
    return {"choices": [{"index": 0, "message": response["message"],
                         "finish_reason": response.get("finish_reason")}]}


def reply_message(node: Node) -> dict[str, Any] | None:
    choices = _chat_response(node.info.get("response") or {}).get("choices") or [{}]
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    return message if isinstance(message, dict) else None


def full_messages(node: Node) -> list[Any]:
    """The node's whole chat-form request: kept while it was a leaf, else rebuilt from its path.

    Rebuilt (after a restart, or for a node whose only child was a dropped retry) as each
    ancestor's new messages followed by its reply as the engine produced it, which is the
    message the agent sent back up to the agent's own re-serialisation of it.
    """
    if node.messages is not None:
        return node.messages
    messages: list[Any] = []
    path = node.path()
    for i, step in enumerate(path):
        if i:
            reply = reply_message(path[i - 1])
            if reply is not None:
                messages.append(reply)
        messages.extend((step.info.get("request") or {}).get("new_messages") or [])
    return messages


def iter_turn_json(plan: ExportPlan) -> Iterator[bytes]:
    """Each retained turn as one JSON object (bytes), in arrival order."""
    for parts in iter_turn_parts(plan):
        yield b"".join(parts)


def _require_trainable(plan: ExportPlan) -> None:
    if plan.trainable_tokens == 0:
        raise NothingTrainableError(plan.session.session_id, plan.reasons)


# Bytes per streamed piece of an export: big enough that writes are few (a 150-turn session is
# ~30 MB), small enough that building one (~1 ms) never holds other sessions' calls back long.
EXPORT_PIECE_BYTES = 1 << 20


async def iter_trace_json(plan: ExportPlan) -> AsyncIterator[bytes]:
    """The whole TrainingTrace JSON in ~1 MB pieces, yielding the event loop between pieces."""
    _require_trainable(plan)
    parts: list[bytes | memoryview] = [b'{"schema_version":1,"turns":[']
    size = 0
    for i, turn in enumerate(iter_turn_parts(plan)):
        if i:
            parts.append(b",")
        parts.extend(turn)
        size += sum(len(part) for part in turn)
        if size >= EXPORT_PIECE_BYTES:
            yield b"".join(parts)
            parts, size = [], 0
            await asyncio.sleep(0)
    parts.append(b"]}")
    yield b"".join(parts)


def trace_json(session: Session) -> bytes:
    """The whole TrainingTrace JSON at once (in-process use and tests): one join, one copy."""
    plan = plan_export(session)
    _require_trainable(plan)
    parts: list[bytes | memoryview] = [b'{"schema_version":1,"turns":[']
    for i, turn in enumerate(iter_turn_parts(plan)):
        if i:
            parts.append(b",")
        parts.extend(turn)
    parts.append(b"]}")
    return b"".join(parts)
