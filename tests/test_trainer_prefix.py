"""Prefix-shared forward (issue 30): the tree pack trains exactly what per-row training trains.

Each test attacks one property: the tree's attention is each row's own causal attention and
nothing more; logprobs and gradients over random trees (rows of several groups, rewritten-history
rows from real traces, duplicates, rows that are prefixes of others, micro-batch splits, chunked
attention) equal per-row (dense, one row per forward) training in fp32 on CPU; each unique prefix
is forwarded once; a group's rows stay on one rank; a trainer step with and without sharing
makes the same update.

Run: .venv/bin/python -m pytest tests/test_trainer_prefix.py -q
"""

from __future__ import annotations

import random

import pytest
import torch

import trainer.tree_attention as tree_attention
from tests.helpers.trainer import prefix_tiny_model
from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, make_trace, make_turn
from trainer.forward import microbatch_logprobs
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.loop import StepInput, run_step
from trainer.loss import policy_loss
from trainer.packing import MicroBatch, pack_rows
from trainer.prefix_tree import TREE_SLACK, pack_tree
from trainer.rows import Row, trace_to_rows
from trainer.tree_attention import tree_backward

VOCAB = 512


def _toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]


def _row(ids: list[int], rng: random.Random, group: int) -> Row:
    mask = [0] + [int(rng.random() < 0.6) for _ in ids[1:]]
    mask[-1] = 1
    logps = [-rng.uniform(0.5, 8.0) if m else 0.0 for m in mask]
    versions = [0 if m else -1 for m in mask]
    return Row(input_ids=ids, loss_mask=mask, behaviour_logprobs=logps, version_start=versions,
               version_end=list(versions), group_index=group, rollout_id=f"g{group}")


def _rewritten_rows(rng: random.Random, system: list[int], group: int) -> list[Row]:
    """A multi-turn rollout whose history is rewritten at turn 2 (a compaction): two rows that
    share the system prompt, built by trace_to_rows from a trace, as the trainer builds them."""
    held = system + _toks(rng, 6)
    turns = []
    for t in range(4):
        if t == 2:
            held = system + _toks(rng, 5)  # the rewrite: no longer extends the row
        comp = _toks(rng, rng.randrange(2, 7))
        turns.append(make_turn(held, comp, [-rng.uniform(0.5, 6.0) for _ in comp],
                               node_id=f"n{t}"))
        held = held + comp + _toks(rng, rng.randrange(1, 5))
    rows, _ = trace_to_rows(make_trace(*turns), rollout_id=f"r{group}", group_index=group)
    assert len(rows) == 2  # the rewrite made a second row
    return rows


def _random_step(seed: int) -> tuple[list[Row], list[float]]:
    """Rows of a random prefix tree: groups share a system prompt, rollouts a task prompt and
    random branch points, plus a duplicate row, a row that is a prefix of another, and
    rewritten-history rows."""
    rng = random.Random(seed)
    system = _toks(rng, rng.randrange(8, 40))
    rows: list[Row] = []
    for g in range(3):
        task = system + _toks(rng, rng.randrange(1, 10))
        stems = [task]
        for _ in range(rng.randrange(2, 6)):
            base = rng.choice(stems)
            ids = base[: rng.randrange(len(system), len(base) + 1)] + _toks(rng, rng.randrange(1, 25))
            stems.append(ids)
            rows.append(_row(ids, rng, g))
        rows.append(_row(list(rows[-1].input_ids[: len(rows[-1]) - 3]), rng, g))  # a prefix row
        rows.extend(_rewritten_rows(rng, system, g))
    rows.append(_row(list(rows[0].input_ids), rng, 0))  # a duplicate, its own mask
    advantages = [rng.uniform(-2.0, 2.0) for _ in rows]
    return rows, advantages


def _per_row_mbs(rows: list[Row], advantages: list[float]) -> list[MicroBatch]:
    """Dense reference: every row its own forward, the loss weights of the whole step."""
    masks = [r.loss_mask for r in rows]
    mbs, stats = pack_rows(rows, masks, advantages, budget=1)  # budget 1: one row each
    assert stats.microbatches == len(rows)
    return mbs


def _grads(model: torch.nn.Module, mbs: list[MicroBatch]) -> tuple[dict, torch.Tensor, float]:
    model.zero_grad(set_to_none=True)
    logps, total = [], 0.0
    for mb in mbs:
        logp, entropy = microbatch_logprobs(model, mb, 0.9)
        loss, _ = policy_loss(logp, mb.behaviour_logprobs, mb.advantages, mb.token_weight,
                              epsilon=0.2, epsilon_high=0.28, entropy=entropy)
        tree_backward(mb, loss)  # = loss.backward() but for a carried trunk (run_step's call)
        total += float(loss.detach())
        logps.append(logp.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    # targets sorted: the two packings order targets differently
    return grads, torch.cat(logps).sort().values, total


def _assert_same(ref: tuple, got: tuple) -> None:
    g_ref, lp_ref, loss_ref = ref
    g_got, lp_got, loss_got = got
    torch.testing.assert_close(lp_got, lp_ref, atol=2e-5, rtol=1e-5)
    assert loss_got == pytest.approx(loss_ref, abs=1e-6)
    scale = max(g.abs().max().item() for g in g_ref.values())
    assert scale > 0
    for name, g in g_ref.items():
        torch.testing.assert_close(g_got[name], g, atol=2e-5 * scale, rtol=1e-4, msg=name)


def test_tree_attention_is_each_rows_causal_attention():
    """Structure alone: in the tree layout, a row's token sees exactly the packed copies of that
    row's earlier tokens (and itself), at depth = its position in the row."""
    for seed in range(20):
        rows, adv = _random_step(seed)
        (mbs,), _ = pack_tree(rows, [r.loss_mask for r in rows], adv, budget=100_000)
        (mb,) = mbs
        mask = mb.tree.dense_mask()
        ids, pos = mb.input_ids[0].tolist(), mb.position_ids[0].tolist()
        for row in rows:
            # the packed position of each token of the row: follow the layout by depth
            where, p = [], 0
            for depth, tok in enumerate(row.input_ids):
                cands = [i for i in range(len(ids)) if pos[i] == depth and ids[i] == tok
                         and (not where or mask[i, where[-1]])]
                assert cands, f"seed {seed}: row token {depth} is not in the pack"
                p = cands[0]
                where.append(p)
            for depth, i in enumerate(where):
                seen = mask[i].nonzero().flatten().tolist()
                assert sorted(seen) == sorted(where[: depth + 1]), (seed, depth)


@pytest.mark.parametrize("seed", range(4))
def test_gradients_equal_per_row_training_over_random_trees(seed):
    model = prefix_tiny_model()
    rows, adv = _random_step(seed)
    ref = _grads(model, _per_row_mbs(rows, adv))
    (mbs,), stats = pack_tree(rows, [r.loss_mask for r in rows], adv, budget=100_000)
    assert stats.microbatches == 1
    assert stats.tokens_forwarded == stats.unique_tokens < stats.row_tokens
    _assert_same(ref, _grads(model, mbs))


def test_gradients_equal_when_the_tree_is_split_and_attention_chunked(monkeypatch):
    """A small budget splits the tree over micro-batches: the trunk every row shares (the system
    prompt) is forwarded once and its keys and values carried, with their gradient, to the
    others; a tiny Q_CHUNK splits segments into query chunks and batches siblings together."""
    monkeypatch.setattr(tree_attention, "Q_CHUNK", 7)
    model = prefix_tiny_model()
    for seed in (10, 3):
        rows, adv = _random_step(seed)
        ref = _grads(model, _per_row_mbs(rows, adv))
        (mbs,), stats = pack_tree(rows, [r.loss_mask for r in rows], adv, budget=60)
        assert [mb.tree.role for mb in mbs] == ["out"] + ["in"] * (len(mbs) - 1)
        assert len(mbs) > 2
        assert stats.tokens_forwarded <= 1.05 * stats.unique_tokens
        longest = max(len(r) for r in rows)
        assert all(mb.n_tokens + mbs[0].n_tokens <= TREE_SLACK * max(60, longest)
                   for mb in mbs[1:])  # the held trunk counts against every later pack
        _assert_same(ref, _grads(model, mbs))


def test_rows_that_are_all_trunk_train_in_the_trunks_pack():
    """Rows equal to the carried trunk (every target predicted inside it) need no pack of their
    own: no empty forward, and their gradient still equals per-row training."""
    rng = random.Random(0)
    trunk = _toks(rng, 30)
    rows = [_row(list(trunk), rng, 0), _row(list(trunk), rng, 1)]
    rows += [_row(trunk + _toks(rng, 20), rng, g) for g in range(4)]
    adv = [rng.uniform(-1.0, 1.0) for _ in rows]
    (mbs,), stats = pack_tree(rows, [r.loss_mask for r in rows], adv, budget=40)
    assert [mb.tree.role for mb in mbs] == ["out"] + ["in"] * 4
    assert all(mb.n_tokens == 20 for mb in mbs[1:]) and stats.carried_tokens == 30
    model = prefix_tiny_model()
    _assert_same(_grads(model, _per_row_mbs(rows, adv)), _grads(model, mbs))


def test_a_shared_prompt_is_forwarded_once():
    """The Claude Code shape in small: 16 rows, one 300-token prompt, 5 tokens each, rows over
    the budget: one forward of 380 tokens (within TREE_SLACK x the longest row) instead of 4,880.
    With 40 rows the tree outgrows one pack and the prompt is carried instead of repeated."""
    rng = random.Random(3)
    prompt = _toks(rng, 300)
    rows = [_row(prompt + [g] + _toks(rng, 4), rng, g // 8) for g in range(40)]  # distinct
    masks = [[0] * 300 + [1] * 5 for _ in rows]
    per_rank, stats = pack_tree(rows[:16], masks[:16], [1.0] * 16, budget=256)
    assert (stats.row_tokens, stats.unique_tokens, stats.tokens_forwarded) == (4880, 380, 380)
    assert stats.over_budget_rows == 16 and stats.microbatches == 1
    m = stats.metrics()
    assert m["packing/forwarded_per_unique"] == 1.0
    assert m["packing/sharing"] == pytest.approx(4880 / 380)
    per_rank, stats = pack_tree(rows, masks, [1.0] * 40, budget=256)
    # 40 rows outgrow one pack (cap 1.25 x 305): the prompt is the carried trunk, forwarded
    # once, and the 200 row tokens go to packs of at most 381 - 300 tokens each
    assert [mb.tree.role for mb in per_rank[0]] == ["out", "in", "in", "in"]
    assert (stats.unique_tokens, stats.tokens_forwarded, stats.carried_tokens) == (500, 500, 300)
    assert all(mb.n_tokens <= int(TREE_SLACK * 305) - 300 for mb in per_rank[0][1:])


def test_a_groups_rows_stay_on_one_rank():
    rng = random.Random(5)
    rows = []
    for g in range(5):  # each group its own token range, so a rank's tokens name its groups
        base = [100 * g + rng.randrange(100) for _ in range(20)]
        rows += [_row(base + [100 * g + rng.randrange(100) for _ in range(rng.randrange(3, 9))],
                      rng, g) for _ in range(4)]
    for world in (2, 3):
        per_rank, stats = pack_tree(rows, [r.loss_mask for r in rows], [1.0] * len(rows),
                                    budget=40, world_size=world)
        assert len({len(m) for m in per_rank}) == 1  # padded to lock-step
        owner: dict[int, int] = {}
        for rank, mbs in enumerate(per_rank):
            for mb in mbs:
                if mb.n_rows == 0:
                    assert float(mb.token_weight.sum()) == 0.0  # padding trains nothing
                    continue
                for g in {t // 100 for t in mb.input_ids[0].tolist()}:
                    assert owner.setdefault(g, rank) == rank, f"group {g} on two ranks"
        assert len(owner) == 5 and len(set(owner.values())) == world
        weights = sum(float(mb.token_weight.sum()) for m in per_rank for mb in m)
        assert weights == pytest.approx(1.0)


def test_a_trainer_step_is_the_same_with_and_without_sharing(tmp_path):
    """Through the trainer (config, staleness, packing, loss, clip): same loss, same gradient
    norm, same statistics. (Parameters after AdamW's first step are not compared: its update is
    g / (|g| + eps), which turns 1e-9 float noise in a near-zero gradient into a full step.)"""
    rows, adv = _random_step(21)
    metrics = {}
    source = ReplaySource(lambda s, k: None, lambda s, k: None)
    for sharing in (False, True):
        model = prefix_tiny_model()
        args = AsyncGRPOConfig(num_generations=2, max_steps=1, learning_rate=1e-2,
                               output_dir=str(tmp_path / str(sharing)), report_to="none",
                               prefix_sharing=sharing, max_grad_norm=None)
        trainer = HarnessAsyncGRPOTrainer(model, lambda sampling: source, args)
        before = [p.detach().clone() for p in model.parameters()]
        metrics[sharing] = run_step(trainer, StepInput(rows=rows, advantages=adv))
        assert metrics[sharing]["version"] == 1.0
        assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    dense, shared = metrics[False], metrics[True]
    assert "packing/forwarded_per_unique" not in dense
    assert shared["packing/forwarded_per_unique"] == 1.0
    assert shared["tokens/forwarded"] < dense["tokens/forwarded"] == shared["packing/row_tokens"]
    assert shared["tokens/trained"] == dense["tokens/trained"]
    for key in ("loss", "grad_norm", "policy/ratio_mean", "policy/entropy", "policy/clip_frac"):
        assert shared[key] == pytest.approx(dense[key], rel=1e-5, abs=1e-7), key


def test_a_carried_trunk_trains_the_same_through_the_trainer_with_a_reference_model(tmp_path):
    """Small budget (the trunk is carried) and beta > 0 (the reference model runs the same
    packs under no_grad: its keys must never mix with the policy's)."""
    rows, adv = _random_step(3)
    metrics = {}
    source = ReplaySource(lambda s, k: None, lambda s, k: None)
    for sharing in (False, True):
        args = AsyncGRPOConfig(num_generations=2, max_steps=1, learning_rate=1e-2, beta=0.1,
                               output_dir=str(tmp_path / str(sharing)), report_to="none",
                               prefix_sharing=sharing, max_grad_norm=None,
                               max_tokens_per_microbatch=60)
        trainer = HarnessAsyncGRPOTrainer(prefix_tiny_model(), lambda sampling: source, args)
        with torch.no_grad():  # a reference that differs from the policy, so a mix-up shows
            for p in trainer.ref_model.parameters():
                p.mul_(0.9)
        metrics[sharing] = run_step(trainer, StepInput(rows=rows, advantages=adv))
    dense, shared = metrics[False], metrics[True]
    assert shared["packing/microbatches"] > 2
    assert shared["packing/forwarded_per_unique"] <= 1.05
    for key in ("loss", "grad_norm", "policy/kl_ref_k3", "policy/entropy"):
        assert shared[key] == pytest.approx(dense[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("norm", ["token", "sequence"])
def test_loss_weights_are_those_of_dense_packing(norm):
    """Same (target, advantage, weight) terms as pack_rows, for both normalisations (sequence:
    per rollout, so a rollout's rewritten-history rows count once together)."""
    rows, adv = _random_step(4)
    masks = [r.loss_mask for r in rows]

    def terms(mbs: list[MicroBatch]) -> list[tuple[int, float, float]]:
        return sorted((t, round(a, 6), round(w, 9)) for mb in mbs for t, a, w in zip(
            mb.target_ids.tolist(), mb.advantages.tolist(), mb.token_weight.tolist(), strict=True))

    dense, _ = pack_rows(rows, masks, adv, budget=1, norm=norm)
    for budget in (100_000, 60):
        (tree,), _ = pack_tree(rows, masks, adv, budget=budget, norm=norm)
        assert terms(tree) == terms(dense)


def test_prefix_sharing_must_be_a_bool():
    problems = AsyncGRPOConfig(prefix_sharing="yes").validate()  # type: ignore[arg-type]
    assert any(p.startswith("prefix_sharing='yes'") for p in problems)


TWO_RANKS = """
import json, random, sys, torch.distributed as dist
sys.path.insert(0, {repo!r})
from tests.helpers.trainer import prefix_tiny_model
from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, make_trace, make_turn
from trainer.grpo import HarnessAsyncGRPOTrainer

def trace(s, k):  # every rollout starts with one 40-token system prompt: the carried trunk
    rng = random.Random(100 * s + k)
    held = [random.Random(7).randrange(10, 500) for _ in range(40)]
    held += [rng.randrange(10, 500) for _ in range(5)]
    turns = []
    for t in range(3):
        comp = [rng.randrange(10, 500) for _ in range(6)]
        turns.append(make_turn(held, comp, [-1.0] * 6, node_id=f"n{{t}}"))
        held = held + comp + [rng.randrange(10, 500) for _ in range(4)]
    return make_trace(*turns)

args = AsyncGRPOConfig(num_generations=4, groups_per_step=2, max_steps=2, learning_rate=1e-2,
                       max_tokens_per_microbatch=64, output_dir={out!r}, report_to="none",
                       dist_timeout_s=120, prefix_sharing={sharing!r})
source = ReplaySource(trace, lambda s, k: float(k % 2))
history = HarnessAsyncGRPOTrainer(prefix_tiny_model(), lambda sampling: source, args).train()
if dist.get_rank() == 0:
    print("HISTORY", json.dumps(history))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_fsdp_ranks_with_a_carried_trunk_train_like_dense(tmp_path):
    """FSDP2 on two gloo ranks: the trunk's backward runs after the other micro-batches'
    backward passes, and two steps (the second after an update) match dense packing."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    histories = {}
    for sharing in (False, True):
        script = tmp_path / f"two_ranks_{sharing}.py"
        script.write_text(TWO_RANKS.format(repo=repo, out=str(tmp_path / f"out{sharing}"),
                                           sharing=sharing))
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", str(script)], capture_output=True, text=True, timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": repo})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("HISTORY "))
        histories[sharing] = json.loads(line[len("HISTORY "):])
    for dense, shared in zip(histories[False], histories[True], strict=True):
        assert shared["packing/carried_tokens"] > 0  # a trunk was carried on some rank
        assert shared["packing/forwarded_per_unique"] <= 1.05
        assert shared["tokens/forwarded"] < dense["tokens/forwarded"]
        for key in ("loss", "grad_norm"):
            assert shared[key] == pytest.approx(dense[key], rel=1e-5, abs=1e-7), key
