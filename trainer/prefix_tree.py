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
4. When a rank's rows need several micro-batches, the *trunk* they all start with (the nodes
   common to every row: a system prompt, a task prompt) is forwarded once as a micro-batch of
   its own; its per-layer keys and values are carried (`TrunkCarry`) to the other micro-batches,
   which attend to detached copies that collect gradients, and after the last of them the
   trunk's graph runs backward once (trainer/tree_attention.py `tree_backward`). The trunk's
   activations stay alive meanwhile, so each later micro-batch's cap is reduced by its size.
   Only that one trunk is carried: a prefix shared by some rows (not all) that land in two
   micro-batches is forwarded in each (`packing/forwarded_per_unique` counts it).

The loss terms are those of dense packing, row by row: a trained token is predicted by the
packed position of its predecessor, so one position may predict the next token of several rows
(each with its own target, advantage and weight). Logprobs and gradients therefore equal
per-row training up to float summation order (tests/test_trainer_prefix.py). The per-token
weights (`norm`) follow `pack_rows`' rule (per rollout for "sequence"); a change to one must
be made in the other.

TRL 1.16 ships a prefix-trie packer (`trl.experimental.async_grpo.packing.TreeRow`) and its
attention (`tree_attention`: gather each segment's root-to-segment path, flash-attn varlen with
bottom-right causal). The layout and the GPU kernel call here are the same idea. Its trie is not
reused: it is per token in Python (2.1 s to pack the 675k-token Claude Code step here, against
0.08 s for this radix tree), keys a node on (token, next token) so each branch costs an extra
token, fetches its kernel from the Hub at run time (GPU only; nothing for CPU), and lives in
`trl.experimental` ("may change or be removed without notice").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

import torch

from trainer.packing import MicroBatch, PackStats, row_token_weight, trainable_rows
from trainer.rows import Row

__all__ = ["TREE_SLACK", "TreeLayout", "TreePackStats", "TrunkCarry", "pack_tree"]

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
    A parent of -2 is the carried trunk (TrunkCarry): key positions 0..ext_len come from it and
    this pack's own keys follow, so `key_index` counts from the trunk's first token.
    """

    seg_start: list[int]
    seg_end: list[int]
    seg_parent: list[int]
    carry: TrunkCarry | None = None  # the trunk this micro-batch writes ("out") or reads ("in")
    role: str | None = None
    ext_len: int = 0  # "in": the carried trunk's tokens, keys 0..ext_len before this pack's own
    _keys: list[torch.Tensor] | None = field(default=None, repr=False)

    @property
    def n_segments(self) -> int:
        return len(self.seg_start)

    def ancestors(self, s: int) -> list[int]:
        """Ancestor segments of s, root first."""
        out = []
        p = self.seg_parent[s]
        while p >= 0:  # -1: a root; -2: the carried trunk
            out.append(p)
            p = self.seg_parent[p]
        return out[::-1]

    def key_index(self, s: int) -> torch.Tensor:
        """[P + L] key positions segment s attends to: its ancestors' tokens, then its own
        (counted after the carried trunk's ext_len keys, which come first when it hangs off it)."""
        if self._keys is None:
            self._keys = []
            e = self.ext_len
            for t in range(self.n_segments):
                chain = [*self.ancestors(t), t]
                parts = [torch.arange(e)] if self.seg_parent[chain[0]] == -2 else []
                parts += [torch.arange(self.seg_start[a] + e, self.seg_end[a] + e) for a in chain]
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


class TrunkCarry:
    """A trunk forwarded once for several micro-batches of one rank (prefix_tree docstring).

    The trunk's micro-batch ("out") stores each attention layer's keys and values (with their
    graph); the later ones ("in") attend to detached copies that collect gradients, and after
    the last of them the trunk's graph is run backward once with those gradients plus the
    trunk's own loss (trainer/tree_attention.py `tree_backward`). Entries are keyed by the
    attention module, so a reference model's forward never mixes with the policy's."""

    def __init__(self, length: int, users: int):
        self.length = length  # trunk tokens
        self.users = users  # "in" micro-batches still to run backward
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.leaves: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.pending: torch.Tensor | None = None  # the trunk micro-batch's loss

    def leaf(self, key: int) -> tuple[torch.Tensor, torch.Tensor]:
        if key not in self.leaves:
            k, v = self.kv[key]
            self.leaves[key] = (k.detach().requires_grad_(k.requires_grad),
                                v.detach().requires_grad_(v.requires_grad))
        return self.leaves[key]

    def release(self) -> None:
        self.kv.clear()
        self.leaves.clear()
        self.pending = None


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
    carried_tokens: int = 0  # trunk tokens forwarded once and carried to later micro-batches

    def metrics(self) -> dict[str, float]:
        out = super().metrics()
        out["packing/row_tokens"] = float(self.row_tokens)
        out["packing/unique_tokens"] = float(self.unique_tokens)
        out["packing/forwarded_per_unique"] = self.tokens_forwarded / max(self.unique_tokens, 1)
        out["packing/sharing"] = self.row_tokens / max(self.tokens_forwarded, 1)
        out["packing/carried_tokens"] = float(self.carried_tokens)
        return out


def _microbatch(items: list[tuple], paths: list[list[_Node]], weights: list[float], *,
                trunk: set[int] = frozenset(), role: str | None = None,
                carry: TrunkCarry | None = None) -> MicroBatch:
    """Lay out the sub-forest spanned by `items` (row, mask, adv, n) depth-first.

    role None: every node of the paths; "out": only the `trunk` nodes (their keys and values
    are carried to later micro-batches); "in": every node but the trunk's, attending to the
    carried trunk. A target lands in the micro-batch that holds its predecessor."""
    keep = (lambda n: id(n) in trunk) if role == "out" else (lambda n: id(n) not in trunk)
    depth: dict[int, int] = {}
    parent: dict[int, int | None] = {}
    kept: dict[int, _Node] = {}
    for path in paths:
        d, prev = 0, None
        for node in path:
            if keep(node) and id(node) not in kept:
                kept[id(node)] = node
                depth[id(node)] = d
                parent[id(node)] = id(prev) if prev is not None else None
            d += len(node.tokens)
            prev = node
    # Depth-first order over the whole tree restricted to these nodes is still depth-first:
    # a parent's order is below its children's, and a subtree's orders are contiguous.
    nodes = sorted(kept.values(), key=lambda n: n.order)
    seg_of = {id(n): s for s, n in enumerate(nodes)}
    ids: list[int] = []
    pos: list[int] = []
    start: dict[int, int] = {}
    seg_start, seg_end, seg_parent = [], [], []
    for n in nodes:
        par = parent[id(n)]
        start[id(n)] = len(ids)
        seg_start.append(len(ids))
        ids.extend(n.tokens)
        pos.extend(range(depth[id(n)], depth[id(n)] + len(n.tokens)))
        seg_end.append(len(ids))
        # -2: the parent is the carried trunk (every one of its tokens is an ancestor)
        seg_parent.append(-1 if par is None else seg_of.get(par, -2))
    index: list[int] = []
    targets: list[int] = []
    blp: list[float] = []
    adv_t: list[float] = []
    weight: list[float] = []
    for (row, mask, adv, _), path, w in zip(items, paths, weights, strict=True):
        where = [start[id(node)] + j if id(node) in start else -1
                 for node in path for j in range(len(node.tokens))]
        # j >= 1 always: position 0 of a row is prompt context (validated in rows.py).
        here = [j for j in compress(range(len(mask)), mask) if where[j - 1] >= 0]
        index.extend(where[j - 1] for j in here)
        targets.extend(row.input_ids[j] for j in here)
        blp.extend(row.behaviour_logprobs[j] for j in here)
        adv_t.extend([adv] * len(here))
        weight.extend([w] * len(here))
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
    ext = carry.length if role == "in" and carry is not None else 0
    mb.tree = TreeLayout(seg_start, seg_end, seg_parent, carry=carry, role=role, ext_len=ext)
    return mb


def _plan(items: list[tuple], paths: list[list[_Node]], order: list[int], budget: int,
          held0: set[int], room: int) -> list[list[int]]:
    """Rows (in depth-first order) into micro-batches: each forwards at most
    TREE_SLACK x max(budget, its longest row) - room tokens, not counting `held0` nodes."""
    groups: list[list[int]] = []
    cur: list[int] = []
    held = set(held0)
    size = longest = 0
    for i in order:
        novel = sum(len(n.tokens) for n in paths[i] if id(n) not in held)
        length = len(items[i][0])
        cap = int(TREE_SLACK * max(budget, longest, length)) - room
        if cur and size + novel > cap:
            groups.append(cur)
            cur, held, size, longest = [], set(held0), 0, 0
            novel = sum(len(n.tokens) for n in paths[i] if id(n) not in held)
        cur.append(i)
        held.update(id(n) for n in paths[i])
        size += novel
        longest = max(longest, length)
    if cur:
        groups.append(cur)
    return groups


def _rank_microbatches(items: list[tuple], paths: list[list[_Node]], budget: int,
                       weight: Callable[[Row], float]) -> list[MicroBatch]:
    order = sorted(range(len(items)), key=lambda i: [n.order for n in paths[i]])
    plain = _plan(items, paths, order, budget, set(), 0)

    def make(group: list[int], **kw: Any) -> MicroBatch:
        return _microbatch([items[j] for j in group], [paths[j] for j in group],
                           [weight(items[j][0]) for j in group], **kw)

    # The trunk: the nodes every row of this rank starts with. When the rows need several
    # micro-batches, forward it once and carry its keys and values to all of them.
    trunk_nodes: list[_Node] = []
    for column in zip(*paths, strict=False):
        if any(n is not column[0] for n in column):
            break
        trunk_nodes.append(column[0])
    t_len = sum(len(n.tokens) for n in trunk_nodes)
    if len(plain) > 1 and t_len > 0:
        trunk = {id(n) for n in trunk_nodes}
        carried = _plan(items, paths, order, budget, trunk, t_len)
        # rows that are all trunk train entirely in the trunk's pack: no empty forward for them
        carried = [g for g in carried if _count_nodes([paths[j] for j in g], trunk) > 0]
        plain_tokens = sum(_count_nodes([paths[j] for j in g]) for g in plain)
        carried_tokens = t_len + sum(_count_nodes([paths[j] for j in g], trunk) for g in carried)
        if carried_tokens < plain_tokens:
            carry = TrunkCarry(length=t_len, users=len(carried))
            out = [make(list(range(len(items))), trunk=trunk, role="out", carry=carry)]
            out += [make(g, trunk=trunk, role="in", carry=carry) for g in carried]
            return out
    return [make(g) for g in plain]


def _count_nodes(paths: list[list[_Node]], skip: set[int] = frozenset()) -> int:
    seen = {id(n): len(n.tokens) for p in paths for n in p if id(n) not in skip}
    return sum(seen.values())


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
    stats = TreePackStats(budget=budget)
    live = trainable_rows(rows, masks, advantages, stats)
    weight = row_token_weight([(row, n) for row, _, _, n in live], norm)  # pack_rows' weights

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
        mbs = _rank_microbatches(items, paths, budget, weight)
        stats.over_budget_rows += sum(len(it[0]) > budget for it in items)
        if mbs and mbs[0].tree.role == "out":
            stats.carried_tokens += mbs[0].n_tokens
        for mb in mbs:
            stats.fill_tokens += min(mb.n_tokens, budget)
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
