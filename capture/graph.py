"""The rollout graph of one session: every engine call, linked to its parent by exact token prefix.

Glossary (DESIGN.md words):

    turn / node   one engine call: the prompt ids the engine tokenized, the ids it sampled
    parent        the earlier node whose prompt+completion is the longest exact prefix of this
                  node's prompt (so this call continued that conversation)
    root          a node that extends nothing: the agent's first call, a subagent, a title
                  generator, or a rewritten/compacted history
    retry         a node with the same parent and the same prompt as a sibling

Decisions, and the measured reasons behind them:

  * Prompt ids come from the engine, never from a local chat template: a re-rendered prompt
    matched the engine on 0 of 28 live turns in OpenEnv's measurement, which fragments one
    conversation into many.
  * Exact prefix or nothing. A harness that rewrites its history (compaction, a re-rendered system
    prompt: Claude Code swaps its system prompt at call ~6) produced a different sequence; attaching
    it would fabricate a trajectory the model never saw, so it starts a new root.
  * Storage is per node: only the prompt tokens this node adds after its parent's end (`seg`) and
    its completion, as `array('i')`. A 150-turn session whose history reaches 41k tokens holds ~41k
    ids, not 150 copies of a growing prompt (OpenEnv's graph held ~283 MB for such a session).
  * Parent lookup never rescans every earlier call. The few most recent leaves, and the parent
    of each ("hot" nodes), keep their whole end sequence as id text (capture.tokens), so the usual
    call (the agent's next turn) is found with one memcmp of its prompt text against one stored
    text, and only the ids after the parent's end are parsed: Python-level work is O(new tokens),
    the history is touched only by C-level compares. A retry or a branch matches the hot parent
    and descends only below it. A miss (a new root, a branch off an old turn) parses the prompt
    once and descends the prefix tree from the roots, comparing each child's own span once.
  * Calls are added when they COMPLETE. A descendant's prompt contains its ancestor's completion,
    so an ancestor always completes before a descendant starts: arrival order is causal order and
    no late re-parenting is needed (OpenEnv needed it because it inserted in a different order).

What this module does not do: decide what is auxiliary (capture.aux, at export, when the whole
session is known) or what is trainable (capture.export).
"""

from __future__ import annotations

import bisect
import hashlib
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .tokens import IdText

__all__ = ["HOT_LEAVES", "Node", "RolloutGraph"]

# How many recent nodes keep their whole token sequence for the fast parent check. Each costs
# ~6 bytes of id text per token of history (~250 KB at 41k ids); parallel subagents rarely exceed a
# handful.
HOT_LEAVES = 4


def _is_under(node: Node, ancestor: Node) -> bool:
    """Whether `node` is `ancestor` or below it (parents are always older: stop early)."""
    while node is not None and node.index > ancestor.index:
        node = node.parent
    return node is ancestor


_SIGN_BYTE = 3 if sys.byteorder == "little" else 0  # the byte of an int32 holding its sign bit
_LOW_BYTES = bytes(range(128))


def _has_negative(ids: array) -> bool:
    """Whether an array('i') holds a negative id, at C speed (no int objects per id)."""
    return bool(ids.tobytes()[_SIGN_BYTE::4].translate(None, _LOW_BYTES))


@dataclass(slots=True, eq=False)
class Node:
    """One completed engine call. Token arrays hold only what this node adds to its parent."""

    node_id: str
    start: int  # = parent's end (prompt+completion length); 0 for a root
    seg: array  # prompt ids [start:prompt_len): what the harness inserted since the parent
    completion: array  # sampled ids
    logprobs: array  # float per completion id; NaN where the engine gave none
    parent: Node | None = None
    children: list[Node] = field(default_factory=list)
    index: int = 0  # arrival order in the session
    info: dict[str, Any] = field(default_factory=dict)  # per-call metadata (dialect, tools, ...)
    # The whole chat-form request as the agent sent it, kept while this node is a leaf so the
    # export can give a conversation's last turn its full messages (never written to the log).
    messages: list[Any] | None = None
    _prompt_key: bytes | None = None
    _seg_text: bytes | None = None  # `seg` as id text (capture.tokens), kept once made

    @property
    def prompt_len(self) -> int:
        return self.start + len(self.seg)

    @property
    def end(self) -> int:
        return self.start + len(self.seg) + len(self.completion)

    @property
    def parent_id(self) -> str | None:
        return self.parent.node_id if self.parent is not None else None

    def prompt_key(self) -> bytes:
        """Identity of (parent, prompt): equal keys mean the same call was sent again (a retry)."""
        if self._prompt_key is None:
            digest = hashlib.blake2b(self.seg.tobytes(), digest_size=16)
            digest.update((self.parent_id or "").encode())
            self._prompt_key = digest.digest()
        return self._prompt_key

    def seg_text(self) -> bytes:
        """This node's new prompt ids as id text (free when the graph cut them from the reply)."""
        if self._seg_text is None:
            self._seg_text = ",".join(map(str, self.seg)).encode()
        return self._seg_text

    def prompt_ids(self) -> array:
        """The whole prompt, rebuilt from the path (used by export; O(prompt length))."""
        out = array("i")
        for node in self.path()[:-1]:
            out.extend(node.seg)
            out.extend(node.completion)
        out.extend(self.seg)
        return out

    def path(self) -> list[Node]:
        """Root -> this node."""
        path: list[Node] = []
        node: Node | None = self
        while node is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path


class RolloutGraph:
    """All completed calls of one session. Not thread-safe: the session serialises writers."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.roots: list[Node] = []
        # node_id -> the node's whole end sequence (prompt + completion) as id text
        # (capture.tokens), for the newest leaves and their parents.
        self._hot: dict[str, bytes] = {}
        self._order: list[Node] = []  # by index
        self._ends: list[tuple[int, int]] = []  # (end, index) of every node, sorted (bisect)

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes.values())

    # --- ingestion ------------------------------------------------------------------------
    def _hot_parent(self, prompt: IdText) -> tuple[Node, bytes] | None:
        """The longest hot node whose whole sequence is a prefix of `prompt` (compared as text)."""
        best: tuple[Node, bytes] | None = None
        # Newest first: the usual call extends the newest leaf, and once it matches, the older hot
        # nodes (its parent, whose text is nearly as long) rank below it and are not compared.
        for node_id, whole in reversed(self._hot.items()):
            node = self.nodes[node_id]
            if (
                (best is None or (node.end, -node.index) > (best[0].end, -best[0].index))
                and prompt.extends(whole)
                # a leaf that sampled nothing: the same prompt again is a retry, not its child
                and (len(node.completion) > 0 or len(prompt.text) > len(whole))
            ):
                best = (node, whole)
        return best

    def find_parent(self, prompt: array) -> Node | None:
        """The node whose prompt+completion is the longest exact prefix of `prompt` (ids)."""
        return self._descend(prompt, self.roots, None)

    def _descend(self, prompt: array, frontier: list[Node], best: Node | None,
                 base: int = 0) -> Node | None:
        """Longest match under `frontier`; `prompt` holds the ids from position `base` on."""
        n = len(prompt) + base
        stack = list(frontier)
        while stack:
            node = stack.pop()
            start, cut, end = node.start - base, node.prompt_len - base, node.end - base
            if cut + base >= n or end + base > n:
                continue
            if prompt[start:cut] != node.seg or prompt[cut:end] != node.completion:
                continue
            if best is None or (node.end, -node.index) > (best.end, -best.index):
                best = node  # equal ends (retry twins that sampled the same): the oldest
            stack.extend(node.children)
        return best

    def add(
        self,
        node_id: str,
        prompt_ids: IdText | list[int] | array,
        completion_ids: list[int] | array,
        logprobs: list[float] | array,
        info: dict[str, Any] | None = None,
    ) -> Node:
        """Insert a completed call, finding its parent by exact prefix. Returns the new node.

        Raises ValueError / TypeError / OverflowError for prompt ids that are not int32 token ids
        (the caller records the call as failed); only the ids it parses are checked, which with
        a hot parent are the new ones: the rest were checked when the parent was added.

        The usual call extends a hot leaf: its prompt is compared to the leaf's ids as text and only
        the ids after the leaf's end are parsed. Otherwise the prompt is parsed once and the tree
        is descended from the roots.
        """
        prompt = prompt_ids if isinstance(prompt_ids, IdText) else IdText.from_ids(prompt_ids)
        completion = completion_ids if isinstance(completion_ids, array) else array(
            "i", completion_ids)
        hot = self._hot_parent(prompt)
        seg_text = None
        if hot is not None:
            top, whole = hot
            parent = top
            seg = prompt.ids_after(whole)  # the prefix is a hot node's, checked when it was added
            deeper = self._descend(seg, parent.children, None, base=parent.end)
            if deeper is None:
                seg_text = prompt.text[len(whole) + 1:]
            else:  # a branch under a hot node that is no longer a leaf (e.g. a retry's parent)
                seg = seg[deeper.end - parent.end:]
                parent = deeper
            if self._may_match_elsewhere(top, parent, parent.end + len(seg)):
                hot = None  # rare: another branch may extend further; decide the certain way
        if hot is None:
            ids, seg_text = prompt.ids(), None
            parent = self.find_parent(ids)
            seg = ids[parent.end:] if parent is not None else ids
        if _has_negative(seg):  # the parent's ids were checked when it was added
            raise ValueError("prompt ids must be non-negative token ids")
        node = Node(
            node_id=node_id,
            start=parent.end if parent is not None else 0,
            seg=seg,
            completion=completion,
            logprobs=logprobs if isinstance(logprobs, array) else array("d", logprobs),
            info=info or {},
            _seg_text=seg_text,
        )
        self._link(node, parent)
        tail = ",".join(map(str, completion)).encode()
        whole = prompt.text + b"," + tail if tail and prompt.text else prompt.text + tail
        self._make_hot(node, whole)
        return node

    def restore(self, node: Node, parent_id: str | None) -> None:
        """Re-insert a node read back from the session log; its parent was decided when it ran."""
        parent = self.nodes.get(parent_id) if parent_id else None
        if parent_id and parent is None:
            raise ValueError(f"session log names parent {parent_id} before it was written")
        if parent is not None and node.start != parent.end:
            raise ValueError(f"session log node {node.node_id} does not start at its parent's end")
        self._link(node, parent)

    def rebuild_hot(self) -> None:
        """After a restore, make the newest leaves hot again (O(hot x history), once)."""
        self._hot.clear()
        leaves = [node for node in self.nodes.values() if not node.children]
        for node in leaves[-HOT_LEAVES:]:
            whole = node.prompt_ids()
            whole.extend(node.completion)
            self._hot[node.node_id] = IdText.from_ids(whole).text

    def _may_match_elsewhere(self, hot: Node, found: Node, n: int) -> bool:
        """Whether a node the hot path did not look at could be a longer (or an equally long,
        older) prefix of an `n`-id prompt than `found` (`hot` or a node below it).

        The candidates are the nodes ending in (found.end, n] (or at found.end, older): hot ones
        were compared already, and so was everything below `hot`. In a linear session the last
        call holds the largest end, so this is one bisect over no candidate; after a rewind, a
        subagent or a replayed branch, a true candidate sends the call to the full descent, which
        is exact (the hot path alone could settle for a shorter parent there)."""
        i = bisect.bisect_left(self._ends, (found.end, -1))
        while i < len(self._ends) and self._ends[i][0] <= n:
            end, index = self._ends[i]
            i += 1
            if end == found.end and index >= found.index:
                continue  # a newer twin never wins a tie
            node = self._order[index]
            if node.node_id not in self._hot and not _is_under(node, hot):
                return True
        return False

    def _link(self, node: Node, parent: Node | None) -> None:
        node.parent = parent
        node.index = len(self.nodes)
        self.nodes[node.node_id] = node
        self._order.append(node)
        bisect.insort(self._ends, (node.end, node.index))
        if parent is None:
            self.roots.append(node)
        else:
            parent.children.append(node)

    def _make_hot(self, node: Node, whole: bytes) -> None:
        # A leaf and its parent stay hot: the parent is what a retry of the leaf extends. Older
        # ancestors are let go (each costs its whole id text).
        if node.parent is not None and node.parent.parent is not None:
            self._hot.pop(node.parent.parent.node_id, None)
        self._hot[node.node_id] = whole
        while len(self._hot) > HOT_LEAVES:
            self._hot.pop(next(iter(self._hot)))

    # --- structure ------------------------------------------------------------------------
    def discarded(self) -> dict[str, str]:
        """Retries nobody continued: node_id -> reason. Decided from shape alone.

        Siblings with the same prompt are one call sent again. If one of them has children, the
        agent continued that one and the others led nowhere; if none has, the agent went on with
        (or ended on) the newest answer, so the older ones are dropped. Either way exactly the
        branch that was continued is kept, and a dropped retry is counted, never silently lost.
        """
        groups: dict[bytes, list[Node]] = {}
        for node in self.nodes.values():
            groups.setdefault(node.prompt_key(), []).append(node)
        dropped: dict[str, str] = {}
        for group in groups.values():
            if len(group) < 2:
                continue
            continued = [node for node in group if node.children]
            keep = continued or [group[-1]]
            for node in group:
                if node not in keep and not node.children:
                    dropped[node.node_id] = "retry_not_continued"
        return dropped

    def stats(self) -> dict[str, int]:
        leaves = sum(1 for node in self.nodes.values() if not node.children)
        forks = sum(1 for node in self.nodes.values() if len(node.children) > 1)
        return {
            "n_turns": len(self.nodes),
            "n_roots": len(self.roots),
            "n_leaves": leaves,
            "n_forks": forks,
            "n_discarded": len(self.discarded()),
            "n_tokens_stored": sum(len(n.seg) + len(n.completion) for n in self.nodes.values()),
        }
