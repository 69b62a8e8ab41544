"""TrainingTrace -> rows: what the trainer steps on, built from engine tokens only.

This module never re-tokenizes. The engine's `prompt_token_ids` are the context, its sampled
`completion_token_ids` the targets, its processed `per_token_logps` the behaviour policy, and
the capture's `loss_mask` decides which targets train. OpenEnv measured why (capture/contract
`to_trace_entries`): a local re-render matched the engine on zero of 28 live turns, and a run
trained on re-rendered prompts collapsed at its first update.

Glossary (DESIGN.md's words): a *turn* is one engine call; a *row* is one token sequence the
trainer forwards once; a *rollout* is one agent run on one task; a *group* is the rollouts of one
task that share a baseline.

How turns become rows (one decision: extend a row only on an exact token prefix):

    turn k prompt P, some open row R with P[:len(R)] == R   -> append P[len(R):] as context
                                                               (mask 0), then turn k's completion
    no open row is a prefix of P (history rewritten,        -> new row: P as context, then the
    compaction, aux call, subagent)                            completion; nothing is dropped

Compaction: an agent that summarises its long history (opencode, Claude Code, Codex) makes a
summarizer call (capture.aux, all-zero mask in the trace: the capture records what happened,
the trainer decides) and then goes on from a history that holds the summary: a rewritten history,
so a new row (capture.placement joins it as `rewritten`). Each surviving context window is its own
row, as in verifiers v1 (one root-to-leaf branch per window). `train_summary_calls` (off by
default until measured) trains the summary's sampled tokens with the rollout's advantage, in
whatever row its prompt extends (its own row when its prompt is a new one, as opencode's is).

There is no "realign" (TRL overwrites a drifted tail as context and loses the sampled tokens'
credit): a rewrite keeps every sampled token and its logprob in a new row. When several open
rows are prefixes, the longest one is extended (least repeated context).

Every token carries the policy version that sampled it: the capture's `weight_version_start`
(the engine's weights when the call began; `weight_version_end` is kept too, and a turn whose
two differ straddled a weight update and is counted). A turn without versions gets the
trainer's version at dispatch, a lower bound, with a WARN: the engine can only be newer.

A turn whose reply a token limit cut (the capture's `metadata.truncated`, with `truncated_by`:
"proxy_cap" for the session's max_tokens cap, "agent_max_tokens", "context"; older traces:
`finish_reason == "length"`) is handled by the `truncated` setting of `trace_to_rows`: "train" it
like any turn (the tokens are real samples; only the ending is the cap's), "mask" it (its tokens
stay as context, mask 0), or "drop" the whole rollout (no rows from it). Each is counted:
`truncated_turn` (WARN, every such turn), `truncated_turn_masked`, `truncated_rollout_dropped`.

Findings are graded as OpenEnv's validate does (FATAL / WARN / INFO, stable snake_case codes
counted in metrics as `rows/findings/<code>`). A FATAL finding raises CaptureError: a capture
whose ids, logprobs and mask disagree trains on the wrong tokens without any error, so training
on it is worse than stopping.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from trainer.errors import CaptureError

__all__ = ["FATAL", "INFO", "TRUNCATED_POLICIES", "WARN", "Finding", "Row", "RowsReport",
           "trace_to_rows"]

FATAL, WARN, INFO = "FATAL", "WARN", "INFO"
TRUNCATED_POLICIES = ("train", "mask", "drop")
NO_VERSION = -1  # version of a token nobody sampled (prompt context)


@dataclass(frozen=True)
class Finding:
    """One graded observation about a trace; `code` is stable and counted in metrics."""

    level: str
    code: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.level}] {self.code}: {self.detail}"


@dataclass
class Row:
    """One padding-free training sequence. T = number of tokens in the row.

    input_ids          list[int]   [T]  engine token ids: prompt context, completions, gaps
    loss_mask          list[int]   [T]  1 = train this token, 0 = context (prompts, gaps,
                                        masked completion tokens, dropped stale tokens)
    behaviour_logprobs list[float] [T]  engine processed logprob of each sampled token (kept for
                                        masked ones too, for provenance); 0.0 where not sampled
    version_start      list[int]   [T]  policy version when the sampling call started; -1 where
                                        not sampled. Staleness is measured from this one.
    version_end        list[int]   [T]  policy version when the sampling call ended; -1 likewise
    rollout_id         str              the rollout this row came from (its reward is shared)
    group_index        int              the group (= seed = task pick) of that rollout
    node_ids           list[str]        turns appended into this row, in order
    n_sampled          int              completion tokens in the row (trainable or not): usage
    """

    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)
    version_start: list[int] = field(default_factory=list)
    version_end: list[int] = field(default_factory=list)
    rollout_id: str = ""
    group_index: int = -1
    node_ids: list[str] = field(default_factory=list)
    n_sampled: int = 0

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def n_trainable(self) -> int:
        return sum(self.loss_mask)

    def _append_context(self, ids: list[int]) -> None:
        n = len(ids)
        self.input_ids.extend(ids)
        self.loss_mask.extend([0] * n)
        self.behaviour_logprobs.extend([0.0] * n)
        self.version_start.extend([NO_VERSION] * n)
        self.version_end.extend([NO_VERSION] * n)

    def _append_completion(
        self, ids: list[int], mask: list[int], logps: list[float], v0: int, v1: int
    ) -> None:
        n = len(ids)
        self.input_ids.extend(ids)
        self.loss_mask.extend(mask)
        self.behaviour_logprobs.extend(logps)
        self.version_start.extend([v0] * n)
        self.version_end.extend([v1] * n)
        self.n_sampled += n


@dataclass
class RowsReport:
    """What `trace_to_rows` saw: findings and usage counts (every dropped thing is counted)."""

    findings: list[Finding] = field(default_factory=list)
    turns: int = 0
    rows: int = 0
    new_rows_from_rewrites: int = 0
    sampled_tokens: int = 0
    trainable_tokens: int = 0
    context_tokens: int = 0
    straddled_turns: int = 0

    def add(self, level: str, code: str, detail: str) -> None:
        self.findings.append(Finding(level, code, detail))

    @property
    def fatal(self) -> list[Finding]:
        return [f for f in self.findings if f.level == FATAL]

    def counts(self) -> Counter[str]:
        return Counter(f.code for f in self.findings)


def _get(turn: Any, name: str, default: Any = None) -> Any:
    return turn.get(name, default) if isinstance(turn, dict) else getattr(turn, name, default)


def _only_ints(xs: list) -> bool:
    # map(type) + set run in C: ~10x faster than a generator over a 30k-token prompt.
    return set(map(type, xs)) == {int}


def _check_turn(turn: Any, index: int, report: RowsReport) -> tuple | None:
    """Validate one turn; return its fields, or None when a FATAL finding was recorded."""
    node = _get(turn, "node_id") or f"#{index}"
    tag = f"turn {index} ({node})"
    prompt = list(_get(turn, "prompt_token_ids") or [])
    completion = list(_get(turn, "completion_token_ids") or [])
    logps = _get(turn, "per_token_logps")
    mask = _get(turn, "loss_mask")
    meta = _get(turn, "metadata") or {}
    before = len(report.fatal)
    if not prompt:
        report.add(FATAL, "no_prompt_ids", f"{tag}: no prompt_token_ids; the engine must run with "
                   "--return-tokens-as-token-ids and the proxy must keep prompt_token_ids")
    for what, ids in (("prompt", prompt), ("completion", completion)):
        if ids and (not _only_ints(ids) or min(ids) < 0):
            report.add(FATAL, "invalid_token_id", f"{tag}: {what} ids must be non-negative ints")
    if logps is None or len(logps) != len(completion):
        got = "none" if logps is None else len(logps)
        report.add(FATAL, "logprob_misalign", f"{tag}: {got} logprobs for {len(completion)} "
                   "sampled ids; an off-by-one shifts credit onto the wrong tokens and still trains")
    elif any(isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
             or x > 0 for x in logps):
        report.add(FATAL, "invalid_logprob", f"{tag}: logprobs must be finite and <= 0")
    if mask is None or len(mask) != len(prompt) + len(completion):
        report.add(FATAL, "length_mismatch", f"{tag}: loss_mask must cover prompt + completion "
                   f"({len(prompt)} + {len(completion)}), got {None if mask is None else len(mask)}")
    elif not _only_ints(mask) or not set(mask) <= {0, 1}:
        report.add(FATAL, "invalid_loss_mask", f"{tag}: loss_mask must hold only ints 0 and 1")
    elif any(mask[: len(prompt)]):
        report.add(FATAL, "trainable_prompt", f"{tag}: prompt positions must have mask 0; "
                   "training on the prompt teaches the model to write its inputs")
    if len(report.fatal) > before:
        return None
    if not completion:
        report.add(WARN, "no_sampled_ids", f"{tag}: empty completion (kept as context)")
    if _truncated(meta):
        report.add(WARN, "truncated_turn", f"{tag}: cut by a token limit "
                   f"({meta.get('truncated_by') or 'finish_reason length'}); tokens are real, "
                   "the ending is an artefact of the limit")
    comp_mask = list(mask[len(prompt):])
    if completion and not any(comp_mask):
        report.add(INFO, "fully_masked_turn", f"{tag}: all {len(completion)} completion tokens "
                   f"masked (aux={meta.get('aux')}, reason={meta.get('aux_reason')}); kept as context")
    return node, prompt, completion, list(logps), comp_mask, meta


def _truncated(meta: dict) -> bool:
    flag = meta.get("truncated")
    return flag is True if flag is not None else meta.get("finish_reason") == "length"


def _versions(meta: dict, fallback: int, tag: str, report: RowsReport) -> tuple[int, int]:
    v0, v1 = meta.get("weight_version_start"), meta.get("weight_version_end")
    if not isinstance(v0, int) or isinstance(v0, bool):
        report.add(WARN, "no_weight_version", f"{tag}: no weight_version_start in metadata; using "
                   f"the dispatch version {fallback} (a lower bound)")
        v0 = fallback
    if not isinstance(v1, int) or isinstance(v1, bool):
        v1 = v0
    if v1 != v0:
        report.straddled_turns += 1
        report.add(INFO, "straddled_weight_update", f"{tag}: sampled across versions {v0}..{v1}; "
                   "staleness counts from the older one")
    return v0, v1


def _summary_mask(index: int, node: str, meta: dict, comp_mask: list[int],
                  report: RowsReport) -> list[int]:
    """A summarizer call's completion mask when summary calls train: every sampled token, unless
    the engine gave some of them no usable logprob (the trace then does not say which: the call
    stays context, counted, rather than train a token against a made-up logprob)."""
    tag = f"turn {index} ({node})"
    if meta.get("masked_logprobs"):
        report.add(WARN, "summary_call_not_trainable", f"{tag}: a summary call with tokens "
                   f"without a usable logprob {meta['masked_logprobs']}; kept as context")
        return comp_mask
    report.add(INFO, "summary_call_trained", f"{tag}: a summary call (compaction) trained with "
               "the rollout's advantage (train_summary_calls=True)")
    return [1] * len(comp_mask)


def trace_to_rows(
    trace: Any, *, rollout_id: str = "", group_index: int = -1, dispatch_version: int = 0,
    truncated: str = "train", train_unplaced: bool = False, train_summary_calls: bool = False,
) -> tuple[list[Row], RowsReport]:
    """Turn one rollout's TrainingTrace (object or its JSON dict) into rows, losslessly.

    Raises CaptureError listing every FATAL finding. Rows with no trainable token are returned
    too (their tokens are usage); the packer leaves them out of the forward and counts them.
    `truncated`: what a turn a token limit cut does (module docstring): "train", "mask", "drop".
    `train_unplaced`: whether a turn the capture marked `unplaced` (a call outside the agent's own
    conversation, capture.placement) makes rows; by default it is left out, counted as
    `unplaced_turn_left_out`.
    `train_summary_calls`: whether the sampled tokens of a summarizer call (the agent compacting
    its history, capture.aux `aux_reason == "summarizer"`) train, with the rollout's advantage
    like its other tokens (module docstring, "Compaction"); off, they are context only.
    """
    if truncated not in TRUNCATED_POLICIES:
        raise ValueError(f"truncated must be one of {TRUNCATED_POLICIES}, got {truncated!r}")
    turns = _get(trace, "turns")
    if turns is None:
        raise CaptureError(f"rollout {rollout_id}: trace has no 'turns'; expected an OpenEnv "
                           "TrainingTrace (schema_version 1)")
    report = RowsReport(turns=len(turns))
    checked = [_check_turn(t, i, report) for i, t in enumerate(turns)]
    seen: set[str] = set()
    for c in checked:
        if c is not None and c[0] in seen:
            report.add(FATAL, "duplicate_node_id", f"node {c[0]} appears twice in one trace")
        if c is not None:
            seen.add(c[0])
    if report.fatal:
        raise CaptureError(
            f"rollout {rollout_id} (group {group_index}): malformed capture, training stopped "
            "because training on it is worse than stopping:\n"
            + "\n".join(f"  {f}" for f in report.fatal)
            + "\nFix the capture proxy / engine flags; the trace is not trainable as sent.",
            report.fatal,
        )
    cut = [c[0] for c in checked if _truncated(c[5])]
    if cut and truncated == "drop":
        report.add(WARN, "truncated_rollout_dropped", f"rollout {rollout_id}: {len(cut)} turn(s) "
                   f"cut by a token limit ({', '.join(cut[:5])}); no rows (truncated='drop')")
        return [], report
    rows: list[Row] = []
    for index, c in enumerate(checked):
        node, prompt, completion, logps, comp_mask, meta = c
        if meta.get("unplaced") is True and not train_unplaced:
            report.add(WARN, "unplaced_turn_left_out", f"turn {index} ({node}): not in the "
                       "agent's own conversation (capture.placement); no rows "
                       "(train_unplaced_calls=False)")
            continue
        if train_summary_calls and meta.get("aux_reason") == "summarizer":
            comp_mask = _summary_mask(index, node, meta, comp_mask, report)
        if truncated == "mask" and _truncated(meta) and any(comp_mask):
            comp_mask = [0] * len(comp_mask)
            report.add(INFO, "truncated_turn_masked", f"turn {index} ({node}): cut by a token "
                       "limit; kept as context (truncated='mask')")
        v0, v1 = _versions(meta, dispatch_version, f"turn {index} ({node})", report)
        # Extend the longest open row that is an exact token prefix of this prompt.
        best: Row | None = None
        for row in rows:
            n = len(row.input_ids)
            if n <= len(prompt) and (best is None or n > len(best.input_ids)) \
                    and prompt[:n] == row.input_ids:
                best = row
        if best is None:
            if rows:
                report.new_rows_from_rewrites += 1
                report.add(INFO, "new_row", f"turn {index} ({node}): prompt extends no open row "
                           "(rewritten history, aux call or subagent); new row, nothing dropped")
            best = Row(rollout_id=rollout_id, group_index=group_index)
            rows.append(best)
        best._append_context(prompt[len(best.input_ids):])
        best._append_completion(completion, comp_mask, logps, v0, v1)
        best.node_ids.append(node)
    report.rows = len(rows)
    for row in rows:
        report.sampled_tokens += row.n_sampled
        trainable = row.n_trainable
        report.trainable_tokens += trainable
        report.context_tokens += len(row) - trainable
    return rows, report
