"""Prefix-shared packing: the rows of a step folded into a prefix tree, each prefix forwarded once.

Why: a Claude Code or Codex step is 32 rows that begin with the same ~21k-token prompt, then
differ by a few hundred tokens. Dense packing (trainer/packing.py) forwards that prompt 32 times;
here it is forwarded once and every row attends to the one copy, so gradients of every row flow
through it (issue 30). Rewritten-history rows of one rollout (trainer/rows.py) share a prefix
with each other the same way.

How:
1. A radix tree over the rows' token ids (`_Node`: a run of tokens with children keyed by their
   first token). A node is split wherever a row ends or two rows diverge, so each row is an
   exact chain of whole nodes, and a node is a *segment*: a run of tokens that attend to their
   ancestors' tokens in full and to themselves causally.
2. Rows go to ranks by group (a group's rows stay on one rank; groups balanced by the unique
   tokens they add), then, per rank, to micro-batches in depth-first order (rows that share
   the most are adjacent), each micro-batch capped at `cap` forwarded tokens: the budget, or the
   longest row it holds when that is longer, times `TREE_SLACK`. A row's tokens cost only what
   the micro-batch does not already forward.
3. A micro-batch is its sub-forest laid out depth-first: a segment's tokens are contiguous and
   come after its parent's; `position_ids` are depths (the position each token had in its row),
   and `TreeLayout` tells trainer/tree_attention.py which keys each segment sees.

The loss terms are those of dense packing, row by row: a trained token is predicted by the
packed position of its predecessor, so one position may predict the next token of several rows
(each with its own target, advantage and weight). Logprobs and gradients therefore equal
per-row training up to float summation order (tests/test_trainer_prefix.py).

TRL 1.16 ships a prefix-forest packer (`trl.experimental.async_grpo.packing.TreeRow`). It shares
only inside one `group_id` (one trie per group), so the prompt that every group of a Claude Code
step shares would still be forwarded once per group, and its attention mask is a FlexAttention
block mask, which on CPU needs torch.compile. Hence this small tree of our own; the placement
idea (a row costs only its novel tokens; a group stays whole) is the same.

What it does not do: carry a prefix's keys and values across micro-batches. A prefix shared by
rows in two micro-batches is forwarded in each (counted in `packing/forwarded_per_unique`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress

import torch

from trainer.packing import MicroBatch, PackStats
from trainer.rows import Row

__all__ = ["TREE_SLACK", "TreeLayout", "TreePackStats", "pack_tree"]

# A micro-batch may forward up to TREE_SLACK x max(budget, its longest row): 32 rows of a 21k
# prompt plus ~100 tokens each need 1.15x the longest row, and one forward of them is far
# cheaper than two that each repeat the prompt. Peak activation memory grows by the same factor.
TREE_SLACK = 1.25


@dataclass
class TreeLayout:
    """Attention structure of one tree micro-batch (N packed tokens, S segments).

    seg_start, seg_end  [S]  packed token range of each segment, in depth-first order
    seg_parent          [S]  index of the parent segment, -1 for a root
    Segment s's tokens see every token of its ancestor segments and, causally, its own.
    """

    seg_start: list[int]
    seg_end: list[int]
    seg_parent: list[int]
    _keys: list[torch.Tensor] | None = field(default=None, repr=False)

    @property
    def n_segments(self) -> int:
        return len(self.seg_start)

    def ancestors(self, s: int) -> list[int]:
        """Ancestor segments of s, root first."""
        out = []
        p = self.seg_parent[s]
        while p >= 0:
            out.append(p)
            p = self.seg_parent[p]
        return out[::-1]

    def key_index(self, s: int) -> torch.Tensor:
        """[P + L] packed positions segment s attends to: its ancestors' tokens, then its own."""
        if self._keys is None:
            self._keys = []
            for t in range(self.n_segments):
                parts = [torch.arange(self.seg_start[a], self.seg_end[a])
                         for a in self.ancestors(t)]
                parts.append(torch.arange(self.seg_start[t], self.seg_end[t]))
                self._keys.append(torch.cat(parts))
        return self._keys[s]

    def dense_mask(self) -> torch.Tensor:
        """[N, N] bool, True where query i may attend key j (for checks, and small packs)."""
        n = self.seg_end[-1] if self.seg_end else 0
        mask = torch.zeros(n, n, dtype=torch.bool)
        for s in range(self.n_segments):
            a, b = self.seg_start[s], self.seg_end[s]
            for anc in self.ancestors(s):
                mask[a:b, self.seg_start[anc]:self.seg_end[anc]] = True
            mask[a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool).tril()
        return mask


class _Node:
    __slots__ = ("tokens", "children", "order")

    def __init__(self, tokens: list[int]):
        self.tokens = tokens
        self.children: dict[int, _Node] = {}
        self.order = -1  # depth-first index, set by _number


def _common(a: list[int], b: list[int], start: int) -> int:
    """Length of the common prefix of a and b[start:]."""
    n = min(len(a), len(b) - start)
    if a[:n] == b[start:start + n]:
        return n
    k = 0
    while a[k] == b[start + k]:
        k += 1
    return k


def _insert(root: _Node, ids: list[int]) -> None:
    node, i = root, 0
    while i < len(ids):
        child = node.children.get(ids[i])
        if child is None:
            node.children[ids[i]] = _Node(ids[i:])
            return
        k = _common(child.tokens, ids, i)
        if k < len(child.tokens):  # split: child keeps tokens[:k], a new node takes the rest
            rest = _Node(child.tokens[k:])
            rest.children = child.children
            child.tokens = child.tokens[:k]
            child.children = {rest.tokens[0]: rest}
        node, i = child, i + k


def _walk(root: _Node, ids: list[int]) -> list[_Node]:
    """The chain of whole nodes that spell ids (every row end is a node boundary)."""
    path, node, i = [], root, 0
    while i < len(ids):
        node = node.children[ids[i]]
        path.append(node)
        i += len(node.tokens)
    if i != len(ids):  # cannot happen after _insert of ids; a wrong layout must not train
        raise AssertionError("prefix tree: a row does not end on a node boundary")
    return path


def _number(root: _Node) -> None:
    stack = list(reversed(root.children.values()))
    k = 0
    while stack:
        node = stack.pop()
        node.order = k
        k += 1
        stack.extend(reversed(node.children.values()))


@dataclass
class TreePackStats(PackStats):
    """PackStats plus what sharing saved: `row_tokens` (dense would forward these) and
    `unique_tokens` (each distinct prefix counted once per rank: the least a rank can forward)."""

    row_tokens: int = 0
    unique_tokens: int = 0

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out["packing/row_tokens"] = float(self.row_tokens)
        out["packing/unique_tokens"] = float(self.unique_tokens)
        out["packing/forwarded_per_unique"] = self.tokens_forwarded / max(self.unique_tokens, 1)
        out["packing/sharing"] = self.row_tokens / max(self.tokens_forwarded, 1)
        return out


def _microbatch(items: list[tuple], paths: list[list[_Node]], weights: list[float]) -> MicroBatch:
    """Lay out the sub-forest spanned by `items` (row, mask, adv, n) depth-first."""
    nodes = sorted({id(n): n for p in paths for n in p}.values(), key=lambda n: n.order)
    # Depth-first order over the whole tree restricted to these nodes is still depth-first:
    # a parent's order is below its children's, and a subtree's orders are contiguous.
    parent_of: dict[int, int] = {}
    for p in paths:
        for a, b in zip(p, p[1:], strict=False):
            parent_of[id(b)] = id(a)
    seg_of = {id(n): s for s, n in enumerate(nodes)}
    ids: list[int] = []
    pos: list[int] = []
    start: dict[int, int] = {}
    depth: dict[int, int] = {}
    seg_start, seg_end, seg_parent = [], [], []
    for n in nodes:
        par = parent_of.get(id(n))
        d = depth[par] + len(nodes[seg_of[par]].tokens) if par is not None else 0
        depth[id(n)] = d
        start[id(n)] = len(ids)
        seg_start.append(len(ids))
        ids.extend(n.tokens)
        pos.extend(range(d, d + len(n.tokens)))
        seg_end.append(len(ids))
        seg_parent.append(seg_of[par] if par is not None else -1)
    index: list[int] = []
    targets: list[int] = []
    blp: list[float] = []
    adv_t: list[float] = []
    weight: list[float] = []
    for (row, mask, adv, n), path, w in zip(items, paths, weights, strict=True):
        where = [start[id(node)] + j for node in path for j in range(len(node.tokens))]
        index.extend([where[j - 1] for j in compress(range(len(mask)), mask)])
        targets.extend(compress(row.input_ids, mask))
        blp.extend(compress(row.behaviour_logprobs, mask))
        adv_t.extend([adv] * n)
        weight.extend([w] * n)
    mb = MicroBatch(
        input_ids=torch.tensor(ids, dtype=torch.long).view(1, -1),  # [1, N]
        position_ids=torch.tensor(pos, dtype=torch.long).view(1, -1),  # [1, N]  depth
        logit_index=torch.tensor(index, dtype=torch.long),  # [K]
        target_ids=torch.tensor(targets, dtype=torch.long),  # [K]
        behaviour_logprobs=torch.tensor(blp, dtype=torch.float32),  # [K]
        advantages=torch.tensor(adv_t, dtype=torch.float32),  # [K]
        token_weight=torch.tensor(weight, dtype=torch.float32),  # [K]
        n_rows=len(items),
        n_tokens=len(ids),
    )
    mb.tree = TreeLayout(seg_start, seg_end, seg_parent)
    return mb


def pack_tree(
    rows: list[Row],
    masks: list[list[int]],
    advantages: list[float],
    *,
    budget: int,
    norm: str = "token",
    world_size: int = 1,
) -> tuple[list[list[MicroBatch]], TreePackStats]:
    """Rows -> per rank, its tree micro-batches (ranks padded to the same count with
    `MicroBatch.empty()`), and the step's packing stats. Same loss weights as `pack_rows`."""
    stats = TreePackStats()
    live = []
    for row, mask, adv in zip(rows, masks, advantages, strict=True):
        n = sum(mask)
        if n == 0:
            stats.rows_context_only += 1
            continue
        live.append((row, mask, adv, n))
    total_tokens = sum(it[3] for it in live)
    total_rows = len(live)

    def weight(n: int) -> float:
        return 1.0 / total_tokens if norm == "token" else 1.0 / (n * total_rows)

    # Groups to ranks: largest first, each to the rank with the fewest unique tokens so far.
    groups: dict[int, list[tuple]] = {}
    for it in live:
        groups.setdefault(it[0].group_index, []).append(it)
    sizes = {g: _unique_tokens([it[0].input_ids for it in its]) for g, its in groups.items()}
    load = [0] * world_size
    per_rank: list[list[tuple]] = [[] for _ in range(world_size)]
    for g in sorted(groups, key=lambda g: (-sizes[g], g)):
        r = min(range(world_size), key=lambda r: (load[r], r))
        per_rank[r].extend(groups[g])
        load[r] += sizes[g]

    out: list[list[MicroBatch]] = []
    for items in per_rank:
        root = _Node([])
        for it in items:
            _insert(root, it[0].input_ids)
        _number(root)
        stats.unique_tokens += _count(root)
        paths = [_walk(root, it[0].input_ids) for it in items]
        order = sorted(range(len(items)), key=lambda i: [n.order for n in paths[i]])
        mbs: list[MicroBatch] = []
        cur: list[int] = []
        held: set[int] = set()
        size = longest = 0
        for i in order:
            novel = sum(len(n.tokens) for n in paths[i] if id(n) not in held)
            length = len(items[i][0])
            cap = int(TREE_SLACK * max(budget, longest, length))
            if cur and size + novel > cap:
                mbs.append(_microbatch([items[j] for j in cur], [paths[j] for j in cur],
                                       [weight(items[j][3]) for j in cur]))
                cur, held, size, longest = [], set(), 0, 0
                novel = length
            if length > budget:
                stats.over_budget_rows += 1
            cur.append(i)
            held.update(id(n) for n in paths[i])
            size += novel
            longest = max(longest, length)
        if cur:
            mbs.append(_microbatch([items[j] for j in cur], [paths[j] for j in cur],
                                   [weight(items[j][3]) for j in cur]))
        for mb in mbs:
            stats.tokens_forwarded += mb.n_tokens
            stats.trainable_tokens += mb.n_targets
        stats.rows_packed += len(items)
        stats.row_tokens += sum(len(it[0]) for it in items)
        out.append(mbs)
    stats.microbatches = sum(len(m) for m in out)
    most = max(len(m) for m in out)
    for m in out:
        m += [MicroBatch.empty() for _ in range(most - len(m))]
    return out, stats


def _count(root: _Node) -> int:
    total, stack = 0, [root]
    while stack:
        node = stack.pop()
        total += len(node.tokens)
        stack.extend(node.children.values())
    return total


def _unique_tokens(seqs: list[list[int]]) -> int:
    root = _Node([])
    for s in seqs:
        _insert(root, s)
    return _count(root)
