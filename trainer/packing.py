"""Padding-free packing of rows into micro-batches under a token budget.

Rows are concatenated into one sequence per micro-batch (batch dimension 1) and `position_ids`
restart at 0 for each row. HF transformers (>= 4.56; 5.x here) detects the restarts when
`attention_mask` is None and no cache is used, and builds a block-causal mask for sdpa/eager
(`masking_utils.find_packed_sequence_indices`), or passes varlen boundaries to flash attention.
So no row ever attends to another and no pad token is forwarded. On sdpa (the default where
flash-attn is not installed) that mask is a dense N x N tensor over the whole pack: attention
cost grows with the square of the pack, not of each row (trainer/loop.py caps CPU packs for
that reason). Only a varlen kernel (flash_attention_2/3) skips the cross-row blocks; the
prefix-shared forward (issue 30) builds its own tree mask. tests/test_trainer_packing.py
checks packed logprobs equal per-row logprobs on the tiny model.

Only the positions that predict a trainable token are projected to the vocabulary
(`logits_to_keep=<index tensor>`): a 150k vocabulary times 8k positions is ~5 GB of fp32
logits, of which agent traces train a few percent.

Packing is first-fit decreasing: longest rows first, each into the first micro-batch with room.
A row longer than the budget gets a micro-batch of its own (splitting it would cut attention),
and is counted (`packing/over_budget_rows`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import compress
from typing import Any

import torch

from trainer.rows import Row

__all__ = ["MicroBatch", "PackStats", "pack_rows"]


@dataclass
class MicroBatch:
    """One forward's worth of packed rows. N = tokens forwarded, K = trainable targets.

    input_ids          [1, N] long     rows concatenated, no padding
    position_ids       [1, N] long     0..len(row)-1 per row (row boundaries for attention)
    logit_index        [K]    long     position whose logits predict each target (target - 1)
    target_ids         [K]    long     the sampled token ids that train
    behaviour_logprobs [K]    float32  engine processed logprobs of those tokens (mu)
    advantages         [K]    float32  the rollout's group-relative advantage, per token
    token_weight       [K]    float32  loss normalisation weight (sums to 1 over the step)
    n_rows, n_tokens   int             rows and tokens in this micro-batch
    tree               TreeLayout|None prefix-tree attention structure (trainer/prefix_tree.py)
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    logit_index: torch.Tensor
    target_ids: torch.Tensor
    behaviour_logprobs: torch.Tensor
    advantages: torch.Tensor
    token_weight: torch.Tensor
    n_rows: int
    n_tokens: int
    # prefix sharing (issue 30): a trainer/prefix_tree.TreeLayout when the pack is a prefix
    # tree (position_ids are depths, attention follows the tree); None for dense rows.
    tree: Any = None

    @property
    def n_targets(self) -> int:
        return int(self.target_ids.numel())

    @classmethod
    def empty(cls) -> MicroBatch:
        """A one-token, zero-weight micro-batch: keeps FSDP ranks in lock-step, adds no gradient."""
        one = torch.zeros(1, dtype=torch.long)
        return cls(
            input_ids=one.view(1, 1),
            position_ids=one.view(1, 1),
            logit_index=one,  # [1] position 0 ...
            target_ids=one,
            behaviour_logprobs=torch.zeros(1),
            advantages=torch.zeros(1),
            token_weight=torch.zeros(1),  # ... with weight 0: no gradient, no stats
            n_rows=0,
            n_tokens=1,
        )

    def to(self, device: torch.device | str) -> MicroBatch:
        fields = {k: (v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v)
                  for k, v in self.__dict__.items()}
        return MicroBatch(**fields)


@dataclass
class PackStats:
    rows_packed: int = 0
    rows_context_only: int = 0  # no trainable token left: not forwarded, tokens still usage
    over_budget_rows: int = 0
    tokens_forwarded: int = 0
    trainable_tokens: int = 0
    microbatches: int = 0
    budget: int = 0  # the token budget the micro-batches were packed under
    fill_tokens: int = 0  # tokens forwarded, an over-budget micro-batch counted as `budget`

    def metrics(self) -> dict[str, float]:
        return {
            "packing/rows": float(self.rows_packed),
            "packing/rows_context_only": float(self.rows_context_only),
            "packing/over_budget_rows": float(self.over_budget_rows),
            "packing/microbatches": float(self.microbatches),
            "tokens/forwarded": float(self.tokens_forwarded),
            "tokens/trained": float(self.trainable_tokens),
            # Tokens forwarded over the budget the micro-batches could hold: 1.0 = every
            # micro-batch full. An over-budget row counts as one full micro-batch.
            "packing/fill_frac": self.fill_tokens / max(self.microbatches * self.budget, 1),
        }


def trainable_rows(rows: list[Row], masks: list[list[int]], advantages: list[float],
                   stats: PackStats) -> list[tuple[Row, list[int], float, int]]:
    """(row, mask, advantage, trainable tokens) of the rows with a trainable token; the rest
    (context only) are counted in `stats.rows_context_only`. Both packers start from it."""
    live = []
    for row, mask, adv in zip(rows, masks, advantages, strict=True):
        n = sum(mask)
        if n == 0:
            stats.rows_context_only += 1
            continue
        live.append((row, mask, adv, n))
    return live


def row_token_weight(live: list[tuple[Row, int]], norm: str) -> Callable[[Row], float]:
    """The loss weight of each trainable token of a row, for a step's (row, trainable tokens).

    Summing weight * per-token loss over the whole step gives its loss: "token" = the mean over
    every trainable token; "sequence" = the mean over ROLLOUTS of each rollout's token mean (a
    rollout split into rows by a rewritten history still counts once: its rows share
    `group_index` and `rollout_id`). Both packers (this one and trainer/prefix_tree.py) use it.
    """
    total_tokens = sum(n for _, n in live)
    rollout_tokens: dict[tuple[int, str], int] = {}  # trainable tokens per rollout (all rows)
    for row, n in live:
        key = (row.group_index, row.rollout_id)
        rollout_tokens[key] = rollout_tokens.get(key, 0) + n
    total_rollouts = len(rollout_tokens)

    def weight(row: Row) -> float:
        if norm == "token":
            return 1.0 / total_tokens
        return 1.0 / (rollout_tokens[(row.group_index, row.rollout_id)] * total_rollouts)

    return weight


def pack_rows(
    rows: list[Row],
    masks: list[list[int]],
    advantages: list[float],
    *,
    budget: int,
    norm: str = "token",
) -> tuple[list[MicroBatch], PackStats]:
    """Pack rows (with their effective masks and advantages) into micro-batches.

    `norm` sets `token_weight` so that summing weight * per-token loss over ALL micro-batches of
    the step gives the step's loss: "token" = mean over every trainable token of the step;
    "sequence" = mean over ROLLOUTS of each rollout's token mean (GRPO's original per-sample
    mean). A rollout whose history was rewritten becomes several rows; it still counts once
    (rows of one rollout share `group_index` and `rollout_id`).
    """
    stats = PackStats(budget=budget)
    live = trainable_rows(rows, masks, advantages, stats)
    weight_of = row_token_weight([(row, n) for row, _, _, n in live], norm)
    bins: list[list[tuple]] = []
    room: list[int] = []
    for item in sorted(live, key=lambda it: len(it[0]), reverse=True):
        size = len(item[0])
        if size > budget:
            stats.over_budget_rows += 1
            bins.append([item])
            room.append(0)
            continue
        for b, free in enumerate(room):
            if size <= free:
                bins[b].append(item)
                room[b] -= size
                break
        else:
            bins.append([item])
            room.append(budget - size)
    out = []
    for items in bins:
        ids: list[int] = []
        pos: list[int] = []
        index: list[int] = []
        targets: list[int] = []
        blp: list[float] = []
        adv_t: list[float] = []
        weight: list[float] = []
        for row, mask, adv, n in items:
            offset = len(ids)
            ids.extend(row.input_ids)
            pos.extend(range(len(row)))
            w = weight_of(row)
            # j >= 1 always: position 0 of a row is prompt context (validated in rows.py).
            index.extend([offset + j - 1 for j in compress(range(len(mask)), mask)])
            targets.extend(compress(row.input_ids, mask))
            blp.extend(compress(row.behaviour_logprobs, mask))
            adv_t.extend([adv] * n)
            weight.extend([w] * n)
        stats.rows_packed += len(items)
        stats.tokens_forwarded += len(ids)
        stats.trainable_tokens += len(targets)
        out.append(MicroBatch(
            input_ids=torch.tensor(ids, dtype=torch.long).view(1, -1),  # [1, N]
            position_ids=torch.tensor(pos, dtype=torch.long).view(1, -1),  # [1, N]
            logit_index=torch.tensor(index, dtype=torch.long),  # [K]
            target_ids=torch.tensor(targets, dtype=torch.long),  # [K]
            behaviour_logprobs=torch.tensor(blp, dtype=torch.float32),  # [K]
            advantages=torch.tensor(adv_t, dtype=torch.float32),  # [K]
            token_weight=torch.tensor(weight, dtype=torch.float32),  # [K]
            n_rows=len(items),
            n_tokens=len(ids),
        ))
        stats.fill_tokens += min(len(ids), budget)  # an over-budget row fills its own, no more
    stats.microbatches = len(out)
    return out, stats
