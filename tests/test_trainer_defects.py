"""Issue 30's smaller defects, each silently wrong before: one test each.

Run: .venv/bin/python -m pytest tests/test_trainer_defects.py -q
"""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from tests.helpers.trainer import make_trainer, seeded_tiny_model
from trainer import loop
from trainer.config import AsyncGRPOConfig
from trainer.loop import StepInput, run_step
from trainer.loss import policy_loss
from trainer.metrics import MetricsWriter
from trainer.packing import pack_rows
from trainer.rows import Row
from trainer.staleness import apply_staleness


def _row(n: int, trainable: int, rollout: str = "r0", version: int = 0) -> Row:
    row = Row(rollout_id=rollout, group_index=0)
    row._append_context(list(range(100, 100 + n - trainable)))
    row._append_completion(list(range(10, 10 + trainable)), [1] * trainable,
                           [-1.0] * trainable, version, version)
    return row


def _weight_by_rollout(rows: list[Row], norm: str) -> dict[str, float]:
    mbs, _ = pack_rows(rows, [r.loss_mask for r in rows], [1.0] * len(rows), budget=64,
                       norm=norm)
    # One micro-batch (budget 64 holds them all), rows in first-fit-decreasing order.
    order = sorted(rows, key=len, reverse=True)
    weights, start = {}, 0
    (mb,) = mbs
    for row in order:
        n = row.n_trainable
        w = mb.token_weight[start:start + n].sum().item()
        weights[row.rollout_id] = weights.get(row.rollout_id, 0.0) + w
        start += n
    return weights


def test_sequence_norm_weighs_rollouts_not_rows():
    # Rollout "a" was split into two rows by a rewritten history; "b" is one row.
    rows = [_row(12, 4, "a"), _row(10, 2, "a"), _row(9, 3, "b")]
    w = _weight_by_rollout(rows, "sequence")
    assert w["a"] == pytest.approx(0.5) and w["b"] == pytest.approx(0.5)  # was 2/3 and 1/3
    # Within rollout "a" every token weighs the same (its token mean), whichever row it is in.
    mbs, _ = pack_rows(rows, [r.loss_mask for r in rows], [1.0] * 3, budget=64, norm="sequence")
    a_weights = mbs[0].token_weight[:6]
    assert torch.allclose(a_weights, torch.full((6,), 0.5 / 6))


def test_forward_backward_time_includes_waiting_for_the_device(tmp_path, monkeypatch):
    calls = []

    def slow_device(device):  # a device still running the backward when the host is done
        calls.append(device)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:
            pass

    monkeypatch.setattr(loop, "device_sync", slow_device)
    trainer = make_trainer(seeded_tiny_model(), tmp_path)
    rows = [_row(20, 5, "a"), _row(20, 5, "b")]
    metrics = run_step(trainer, StepInput(rows=rows, advantages=[1.0, -1.0]))
    assert calls, "the step never waited for the device"
    assert metrics["time/forward_backward_s"] >= 0.3


def test_fsdp_gradient_sync_runs_on_the_last_micro_batch_only(tmp_path):
    model = seeded_tiny_model()
    seen = []
    model.set_requires_gradient_sync = seen.append  # FSDP2's FSDPModule method, recorded
    # dense packing: these three rows are identical, so prefix sharing would forward them once
    trainer = make_trainer(model, tmp_path, max_tokens_per_microbatch=16, prefix_sharing=False)
    rows = [_row(20, 5, f"r{i}") for i in range(3)]  # each over the budget: 3 micro-batches
    metrics = run_step(trainer, StepInput(rows=rows, advantages=[1.0, -1.0, 0.5]))
    assert metrics["packing/microbatches"] == 3
    assert seen == [False, False, True]
    # Where the unsharded gradients would not fit (config.py), every micro-batch reduces.
    seen.clear()
    trainer.args.reduce_grads_per_microbatch = True
    run_step(trainer, StepInput(rows=rows, advantages=[1.0, -1.0, 0.5]))
    assert seen == []


def test_auto_defers_the_gradient_reduce_only_where_unsharded_gradients_fit(monkeypatch):
    # "auto": hold unsharded bf16 gradients (2 bytes/parameter) to the last micro-batch only where
    # they fit in a quarter of the GPU; a 32B model (64 GB of them) reduces every micro-batch.
    from types import SimpleNamespace

    from trainer.loop import defer_grad_sync

    model = torch.nn.Linear(1000, 1000)  # 1,001,000 parameters: ~2 MB of bf16 gradients
    cuda = torch.device("cuda", 0)
    for total_memory, expected in ((8_000_000, False), (8_008_000, True), (80 * 2**30, True)):
        monkeypatch.setattr(torch.cuda, "get_device_properties",
                            lambda _d, m=total_memory: SimpleNamespace(total_memory=m))
        assert defer_grad_sync(model, "auto", cuda) is expected, total_memory
    assert defer_grad_sync(model, True, cuda) is False  # forced per micro-batch
    assert defer_grad_sync(model, False, cuda) is True
    assert defer_grad_sync(model, "auto", torch.device("cpu")) is True
    problems = AsyncGRPOConfig(reduce_grads_per_microbatch="sometimes").validate()
    assert any("reduce_grads_per_microbatch='sometimes'" in p for p in problems), problems


def test_is_cap_at_the_clip_bound_is_refused_because_the_clipped_gradient_leaks():
    # The leak itself: r = C = 1 + eps_high, negative advantage -> the clip must stop the push.
    logp = torch.tensor([math.log(1.28)], requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1), torch.tensor([-1.0]), torch.ones(1),
                          epsilon_high=0.28, is_cap=1.28)
    loss.backward()
    assert logp.grad.abs().item() > 0.1  # measured -1.28 here: the leak the check refuses
    problems = AsyncGRPOConfig(is_cap=1.28, epsilon_high=0.28).validate()
    assert any(p.startswith("is_cap=1.28") and "leaks" in p for p in problems), problems
    assert AsyncGRPOConfig(is_cap=1.29, epsilon_high=0.28).validate() == []


def test_vllm_server_base_url_is_refused_with_what_to_do_instead():
    problems = AsyncGRPOConfig(vllm_server_base_url="http://127.0.0.1:8000").validate()
    assert len(problems) == 1 and "weight_sync=VLLMWeightSync" in problems[0]


def test_logging_steps_logs_every_nth_step_and_the_last(tmp_path):
    cfg = AsyncGRPOConfig(output_dir=str(tmp_path), report_to="jsonl", logging_steps=2)
    writer = MetricsWriter.create(cfg, enabled=True, console=False)
    for step in range(1, 6):
        writer.log(step, {"loss": float(step)})
    writer.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [2, 4, 5]


def test_packing_fill_is_a_fraction_of_the_budget():
    rows = [_row(30, 2), _row(10, 2)]
    _, full = pack_rows(rows, [r.loss_mask for r in rows], [1.0, 1.0], budget=40)
    _, half = pack_rows(rows, [r.loss_mask for r in rows], [1.0, 1.0], budget=80)
    assert "packing/fill" not in full.metrics()
    assert full.metrics()["packing/fill_frac"] == pytest.approx(1.0)
    assert half.metrics()["packing/fill_frac"] == pytest.approx(0.5)
    _, over = pack_rows([_row(50, 2)], [_row(50, 2).loss_mask], [1.0], budget=20)
    assert over.metrics()["packing/fill_frac"] == pytest.approx(1.0)  # full, not 250%


def test_truncated_frac_counts_every_truncated_token_over_all_trained_tokens(tmp_path):
    # Four tokens: r = 3 > C = 2 on a negative- and a positive-advantage token, r = 1 on two.
    logp = torch.log(torch.tensor([3.0, 3.0, 1.0, 1.0]))
    _, stats = policy_loss(logp, torch.zeros(4), torch.tensor([-1.0, 1.0, 1.0, -1.0]),
                           torch.full((4,), 0.25), is_cap=2.0, epsilon_high=0.28)
    assert stats["truncated"] / stats["tokens"] == pytest.approx(0.5)


def test_tokens_sampled_by_a_newer_version_are_counted_not_clamped_silently():
    rows = [_row(10, 4, version=3), _row(10, 2, version=1)]
    _, stats = apply_staleness(rows, policy_version=1, max_staleness=1, rule="correct")
    m = stats.metrics()
    assert m["staleness/ahead_tokens"] == 4.0
    assert m["staleness/max"] == 0.0 and m["staleness/mean"] == 0.0


def _expected_step_loss(trainer, rows: list[Row], advantages: list[float], norm: str) -> float:
    """The step's loss computed outside run_step: pack with `norm`, forward, policy_loss."""
    from trainer.forward import microbatch_logprobs

    args = trainer.args
    mbs, _ = pack_rows(rows, [r.loss_mask for r in rows], advantages,
                       budget=loop._pack_budget(trainer.model, rows, args.max_tokens_per_microbatch),
                       norm=norm)
    total = 0.0
    with torch.no_grad():
        for mb in mbs:
            logp, entropy = microbatch_logprobs(trainer.model, mb, args.temperature)
            loss, _ = policy_loss(logp, mb.behaviour_logprobs, mb.advantages, mb.token_weight,
                                  loss_type=args.loss_type, epsilon=args.epsilon,
                                  epsilon_high=args.epsilon_high, is_cap=args.is_cap,
                                  beta=0.0, entropy=entropy)
            total += loss.item()
    return total


def test_a_step_with_loss_norm_sequence_trains_with_sequence_weights(tmp_path):
    """The config reaches the packer: the step's loss is the per-rollout mean, which for these
    rows (6 trainable tokens at A = +1 against 2 at A = -1) is far from the token mean."""
    trainer = make_trainer(seeded_tiny_model(), tmp_path, loss_norm="sequence")
    rows = [_row(14, 6, "a"), _row(10, 2, "b")]
    advantages = [1.0, -1.0]
    sequence = _expected_step_loss(trainer, rows, advantages, "sequence")
    token = _expected_step_loss(trainer, rows, advantages, "token")
    assert abs(sequence - token) > 0.1  # the two normalisations are told apart here
    metrics = run_step(trainer, StepInput(rows=rows, advantages=advantages))
    assert metrics["loss"] == pytest.approx(sequence, rel=1e-4, abs=1e-6)
