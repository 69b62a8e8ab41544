"""Attention that honours a prefix tree (trainer/prefix_tree.py), through transformers' public
`AttentionInterface`.

A tree micro-batch lays each segment (a run of tokens rows share) out once; a segment's queries
see its ancestors' keys in full and its own causally. That is the attention each row had alone,
so logprobs and gradients match per-row training; the shared keys sit once in the autograd
graph, and every row's gradient flows back into them.

Two kernels, chosen per call:
- CUDA with `flash_attn` installed (bf16/fp16): one `flash_attn_varlen_func` call. Each
  segment's queries are one sequence, its root-to-segment path gathered as that sequence's keys,
  and `causal=True`, which flash-attn aligns bottom-right: exactly "ancestors in full, own
  causally" (the layout TRL 1.16's tree packer uses). Not exercised on this CPU-only machine.
- Otherwise (CPU; a GPU without flash_attn): `scaled_dot_product_attention` per root segment with
  `is_causal` (the memory-lean flash kernel on CPU too), then the other segments in batches of at
  most `Q_CHUNK` queries that share a parent: their keys are the parent's path plus their own,
  with an explicit boolean mask (full over the path, causal within each segment). The masks
  depend only on the layout, so they are built once per micro-batch and reused by every layer.

A carried trunk (prefix_tree.TrunkCarry): the trunk's pack stores each layer's keys and values;
a later pack puts the trunk's (detached copies that collect gradients) before its own, and
`tree_backward` runs the trunk's graph once after the last of them.

Registered under `TREE_ATTENTION`; without a tree (dense rows, `MicroBatch.empty()`) the function
is transformers' own sdpa with sdpa's mask, so a model switched to it computes dense packs as
before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from trainer.prefix_tree import TreeLayout

__all__ = ["Q_CHUNK", "TREE_ATTENTION", "TREE_KWARG", "tree_attention", "tree_backward",
           "tree_forward_kwargs", "use_tree_attention"]

TREE_ATTENTION = "harness_tree"
TREE_KWARG = "harness_tree"  # the model-forward keyword that carries a TreeLayout to attention
# Queries per sdpa call off the root: the explicit mask and scores are Q_CHUNK x keys per head.
Q_CHUNK = 1024


@dataclass
class _Batch:
    """One sdpa call: its queries are the packed runs `q_ranges`, its keys `key_index`."""

    q_ranges: list[tuple[int, int]]
    key_index: torch.Tensor  # [Lk]
    mask: torch.Tensor | None  # [Lq, Lk] bool, None: causal over one root segment


def _plan(layout: TreeLayout) -> list[_Batch]:
    """The sdpa calls that cover every query of the layout once (see the module docstring)."""
    batches: list[_Batch] = []
    children: dict[int, list[int]] = {}
    e = layout.ext_len
    for s, p in enumerate(layout.seg_parent):
        if p == -1:
            a, b = layout.seg_start[s], layout.seg_end[s]
            batches.append(_Batch([(a, b)], torch.arange(a + e, b + e), None))
        else:
            children.setdefault(p, []).append(s)
    for p, segs in children.items():
        # [P] the parent's ancestors, then the parent; -2: the carried trunk
        path = torch.arange(e) if p == -2 else layout.key_index(p)
        pieces: list[tuple[int, int, int]] = []  # (segment, q0, q1) offsets inside the segment
        for s in segs:
            n = layout.seg_end[s] - layout.seg_start[s]
            pieces.extend((s, q0, min(q0 + Q_CHUNK, n)) for q0 in range(0, n, Q_CHUNK))
        group: list[tuple[int, int, int]] = []
        for piece in pieces + [None]:
            if piece is not None and (not group or sum(q1 - q0 for _, q0, q1 in group)
                                      + piece[2] - piece[1] <= Q_CHUNK):
                group.append(piece)
                continue
            batches.append(_batch(layout, path, group))
            group = [piece] if piece is not None else []
    return batches


def _batch(layout: TreeLayout, path: torch.Tensor, group: list[tuple[int, int, int]]) -> _Batch:
    n_q = sum(q1 - q0 for _, q0, q1 in group)
    n_k = len(path) + sum(q1 for _, _, q1 in group)
    mask = torch.zeros(n_q, n_k, dtype=torch.bool)
    mask[:, : len(path)] = True
    keys, ranges = [path], []
    row, col = 0, len(path)
    for s, q0, q1 in group:
        a = layout.seg_start[s]
        keys.append(torch.arange(a + layout.ext_len, a + layout.ext_len + q1))
        ranges.append((a + q0, a + q1))
        # query q0 + i of the segment sees its own keys 0..q0 + i (causal, bottom-right)
        own = torch.ones(q1 - q0, q1, dtype=torch.bool).tril(diagonal=q0)
        mask[row:row + q1 - q0, col:col + q1] = own
        row += q1 - q0
        col += q1
    return _Batch(ranges, torch.cat(keys), mask)


def _cached(layout: TreeLayout, device: torch.device) -> Any:
    cache = layout.__dict__.setdefault("_attn_cache", {})
    if device not in cache:
        cache[device] = [
            _Batch(b.q_ranges, b.key_index.to(device),
                   None if b.mask is None else b.mask.to(device))
            for b in _plan(layout)
        ]
    return cache[device]


def _tree_sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
               value: torch.Tensor, layout: TreeLayout, scaling: float | None) -> torch.Tensor:
    # Grouped-query attention: repeat K/V per query head rather than sdpa's enable_gqa, which on
    # CPU falls back to the math kernel (an NxN score matrix; ~10x slower at 2k tokens).
    groups = query.shape[1] // key.shape[1]
    e = layout.ext_len
    if groups > 1:
        key, value = (x.repeat_interleave(groups, dim=1) for x in (key, value))
    pieces: list[tuple[int, torch.Tensor]] = []  # (packed start, [1, H, L, D])
    for b in _cached(layout, query.device):
        if b.mask is None:  # a root segment: plain causal attention over its own tokens
            a, z = b.q_ranges[0]
            out = F.scaled_dot_product_attention(query[:, :, a:z], key[:, :, a + e:z + e],
                                                 value[:, :, a + e:z + e], is_causal=True,
                                                 scale=scaling)
            pieces.append((a, out))
            continue
        q = torch.cat([query[:, :, a:e] for a, e in b.q_ranges], dim=2)  # [1, H, Lq, D]
        k = key.index_select(2, b.key_index)  # [1, Hkv, Lk, D]
        v = value.index_select(2, b.key_index)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=b.mask, scale=scaling)
        sizes = [e - a for a, e in b.q_ranges]
        pieces.extend(zip([a for a, _ in b.q_ranges], out.split(sizes, dim=2), strict=True))
    # A batch's queries come from sibling segments with other subtrees between them: put every
    # run back at its packed position (the runs tile 0..N exactly).
    pieces.sort(key=lambda p: p[0])
    out = torch.cat([t for _, t in pieces], dim=2)  # [1, H, N, D]
    return out.transpose(1, 2).contiguous()  # [1, N, H, D]  what HF's attention returns


def _carry(module: torch.nn.Module, layout: TreeLayout, key: torch.Tensor,
           value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Trunk carry (prefix_tree.TrunkCarry): "out" keeps this layer's keys and values; "in"
    puts the trunk's (detached, gradient-collecting copies) before this pack's own."""
    if layout.carry is None:
        return key, value
    if layout.role == "out":
        layout.carry.kv[id(module)] = (key, value)
        return key, value
    k, v = layout.carry.leaf(id(module))
    return torch.cat([k.to(key.dtype), key], dim=2), torch.cat([v.to(value.dtype), value], dim=2)


def tree_backward(mb: Any, loss: torch.Tensor) -> None:
    """`loss.backward()` for a micro-batch, honouring a carried trunk: the trunk's micro-batch
    waits, its users run backward into the carried copies, and after the last user the trunk's
    graph runs once, with its own loss and the gradients its keys and values collected."""
    layout = getattr(mb, "tree", None)
    carry = layout.carry if layout is not None else None
    if carry is None:
        loss.backward()
        return
    if layout.role == "out":
        carry.pending = loss
        return
    loss.backward()
    carry.users -= 1
    if carry.users > 0:
        return
    tensors, grads = [carry.pending], [torch.ones_like(carry.pending)]
    for key, (k, v) in carry.kv.items():
        lk, lv = carry.leaves.get(key, (None, None))
        for t, leaf in ((k, lk), (v, lv)):
            if leaf is not None and leaf.grad is not None and t.requires_grad:
                tensors.append(t)
                grads.append(leaf.grad)
    carry.release()
    torch.autograd.backward(tensors, grads)


def _flash_varlen() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def _tree_flash(fn: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                layout: TreeLayout, scaling: float | None) -> torch.Tensor:
    cache = layout.__dict__.setdefault("_flash_cache", {})
    if query.device not in cache:
        paths = [layout.key_index(s) for s in range(layout.n_segments)]
        lens_q = [e - a for a, e in zip(layout.seg_start, layout.seg_end, strict=True)]
        cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
        cu_k = torch.tensor([0, *torch.tensor([len(p) for p in paths]).cumsum(0).tolist()],
                            dtype=torch.int32)
        cache[query.device] = (torch.cat(paths).to(query.device), cu_q.to(query.device),
                               cu_k.to(query.device), max(lens_q), max(len(p) for p in paths))
    kv_index, cu_q, cu_k, max_q, max_k = cache[query.device]
    q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))  # [N, H, D]
    out = fn(q, k.index_select(0, kv_index), v.index_select(0, kv_index), cu_q, cu_k,
             max_q, max_k, softmax_scale=scaling, causal=True)  # causal is bottom-right aligned
    return out.unsqueeze(0)  # [1, N, H, D]


def tree_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                   value: torch.Tensor, attention_mask: torch.Tensor | None,
                   scaling: float | None = None, dropout: float = 0.0,
                   **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: query [1, H, N, D], key/value [1, Hkv, N, D] ->
    ([1, N, H, D], None). Without a `harness_tree` keyword it is transformers' sdpa."""
    layout: TreeLayout | None = kwargs.pop(TREE_KWARG, None)
    if layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"tree attention packs one sequence per forward; got batch "
                         f"{query.shape[0]} (trainer/prefix_tree.py builds [1, N] inputs)")
    if dropout:
        raise ValueError("tree attention has no dropout; the trainer forwards with dropout 0")
    if kwargs.get("sliding_window"):
        raise ValueError("tree attention does not implement sliding-window layers; set "
                         "prefix_sharing=False for this model")
    key, value = _carry(module, layout, key, value)
    fn = _flash_varlen() if query.is_cuda and query.dtype in (torch.bfloat16, torch.float16) \
        else None
    if fn is not None:
        return _tree_flash(fn, query, key, value, layout, scaling), None
    return _tree_sdpa(module, query, key, value, layout, scaling), None


AttentionInterface.register(TREE_ATTENTION, tree_attention)
# Dense packs under this implementation get sdpa's mask; tree packs pass no mask at all.
AttentionMaskInterface.register(TREE_ATTENTION, sdpa_mask)


def use_tree_attention(model: torch.nn.Module) -> None:
    """Switch a transformers model to tree attention (idempotent; dense packs still work)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"prefix sharing needs a transformers PreTrainedModel, got "
                        f"{type(model).__name__}; set prefix_sharing=False")
    if config._attn_implementation != TREE_ATTENTION:
        model.set_attn_implementation(TREE_ATTENTION)


def tree_forward_kwargs(model: torch.nn.Module, tree: TreeLayout | None) -> dict[str, Any]:
    """Extra model-forward keywords for a micro-batch: {} for dense rows; for a tree, switch the
    model to tree attention, skip transformers' mask building (the tree is the mask; a packed
    NxN mask would be built from the depth position_ids otherwise) and hand the layout down."""
    if tree is None:
        return {}
    use_tree_attention(model)
    return {"attention_mask": {"full_attention": None, "sliding_attention": None},
            TREE_KWARG: tree}
