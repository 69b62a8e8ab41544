"""The trainer on the tiny model: what a step does to logprobs, what never makes a gradient,
the async producer's ordering rules, a pinned first-step loss, and resume after a kill.

Run: .venv/bin/python -m pytest tests/test_trainer_step.py -q
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.trainer import make_trainer, replay_source, seeded_tiny_model
from tests.helpers.waiting import until, wait_until
from trainer.config import AsyncGRPOConfig
from trainer.errors import CaptureError
from trainer.fakes import ReplaySource, make_trace, make_turn, synthetic_trace
from trainer.forward import row_logprobs
from trainer.groups import prepare_group
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.loop import StepInput, run_step
from trainer.producer import RolloutProducer
from trainer.rollouts import Rollout
from trainer.rows import trace_to_rows

REPO = Path(__file__).resolve().parents[1]


def test_a_step_raises_positive_advantage_tokens_and_lowers_negative_ones(tmp_path):
    model = seeded_tiny_model()
    good = trace_to_rows(make_trace(make_turn([5, 6, 7], [40, 41, 42], node_id="g")))[0]
    bad = trace_to_rows(make_trace(make_turn([5, 6, 7], [90, 91, 92], node_id="b")))[0]
    before = row_logprobs(model, good + bad, temperature=1.0)
    for row, lps in zip(good + bad, before, strict=True):  # behaviour = current policy: r = 1
        row.behaviour_logprobs[-3:] = lps
    trainer = make_trainer(model, tmp_path, learning_rate=1e-2)
    metrics = run_step(trainer, StepInput(rows=good + bad, advantages=[1.0, -1.0]))
    after = row_logprobs(model, good + bad, temperature=1.0)
    assert metrics["policy/ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert sum(after[0]) > sum(before[0]) + 0.01  # positive advantage: more likely
    assert sum(after[1]) < sum(before[1]) - 0.01  # negative advantage: less likely
    assert trainer.state.policy_version == 1


def test_none_and_zero_variance_groups_produce_no_gradient_and_no_update(tmp_path):
    model = seeded_tiny_model()
    trainer = make_trainer(model, tmp_path)
    trace = synthetic_trace(random.Random(0), vocab=500)
    unscorable = [Rollout(cause="ok", trace=trace, env_reward=None)] * 2
    flat = [Rollout(cause="ok", trace=trace, env_reward=1.0)] * 2
    groups = [prepare_group(rs, group_index=i, reward_funcs=[], scale_rewards=True,
                            dispatch_version=0) for i, rs in enumerate((unscorable, flat))]
    assert [g.skipped for g in groups] == ["no_scored", "zero_variance"]
    weights = [p.detach().clone() for p in model.parameters()]
    metrics = run_step(trainer, StepInput(rows=[r for g in groups for r in g.rows]))
    assert metrics["steps/empty"] == 1.0 and trainer.state.policy_version == 0
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters(), strict=True))


def test_the_first_step_loss_of_a_cpu_end_to_end_run_is_pinned(tmp_path):
    trainer = make_trainer(seeded_tiny_model(), tmp_path, source=replay_source(), num_generations=4,
                       max_steps=2, learning_rate=1e-3, report_to="jsonl")
    history = trainer.train()
    # Synthetic traces (behaviour logprobs drawn in [-9, -0.5]) against seeded weights: the
    # ratios are far from 1, so clipping and truncation are both exercised in this number.
    assert history[0]["loss"] == pytest.approx(0.333451, abs=1e-5)
    assert history[0]["policy/clip_frac"] > 0 and history[0]["policy/truncated_frac"] > 0
    assert [h["version"] for h in history] == [1.0, 2.0]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"rewards/env_reward/mean": 0.5' in lines[0]


def test_the_progress_line_names_each_number_once_and_says_what_it_is(tmp_path):
    from trainer.metrics import HEADLINE, headline

    trainer = make_trainer(seeded_tiny_model(), tmp_path, source=replay_source(), num_generations=4,
                           max_steps=1, learning_rate=1e-3)
    (metrics,) = trainer.train()  # a real step's metrics dict
    assert set(HEADLINE) <= set(metrics), set(HEADLINE) - set(metrics)
    line = headline(metrics)
    keys = [part.split("=", 1)[0] for part in line.split()]
    assert keys == ["loss", "reward_mean", "grad_norm", "ratio_mean", "staleness_mean"], line
    assert len(set(keys)) == len(keys) and "mean=" not in line.replace("_mean=", "")
    assert f"reward_mean={metrics['reward/mean']:.4g}" in line


def test_a_malformed_capture_stops_training_with_capture_error(tmp_path):
    bad = {"turns": [{"node_id": "x", "prompt_token_ids": [1], "completion_token_ids": [2, 3],
                      "per_token_logps": [-1.0], "loss_mask": [0, 1, 1]}]}
    source = ReplaySource(lambda s, k: bad, lambda s, k: float(k))
    trainer = make_trainer(seeded_tiny_model(), tmp_path, source=source)
    with pytest.raises(CaptureError, match="logprob_misalign"):
        trainer.train()


def _producer(source, **kw) -> RolloutProducer:
    args = {"num_generations": 3, "groups_per_step": 1, "max_staleness": 1,
            "max_concurrent_rollouts": 8, "start_group": 0, "version": lambda: 0, **kw}
    return RolloutProducer(source, **args)


def test_a_group_is_released_only_when_all_its_rollouts_have_finished():
    # rollout k=2 of group 0 is slow; group 0 must come out whole, and first (index order).
    source = ReplaySource(lambda s, k: None, lambda s, k: 1.0,
                          delay_fn=lambda s, k: 0.3 if (s, k) == (0, 2) else 0.0)

    async def run():
        producer = _producer(source)
        producer.start()
        t0 = time.monotonic()
        first = await producer.next_group()
        waited = time.monotonic() - t0
        await producer.stop()
        return first, waited

    first, waited = asyncio.run(run())
    assert first.index == 0 and len(first.results) == 3 and waited >= 0.3


def test_admission_keeps_the_producer_at_most_max_staleness_steps_ahead():
    source = ReplaySource(lambda s, k: None, lambda s, k: 1.0)

    async def run():
        producer = _producer(source, max_staleness=2)
        seeds = lambda: sorted({s for s, _ in source.calls})  # noqa: E731
        producer.start()
        # The dispatcher admits groups in one burst, without yielding to the loop, until the
        # bound stops it: by the time any admitted group's rollout runs, `next_dispatch` is the
        # first group the bound holds back. A producer that ran ahead would show it here, on
        # any machine's timing (no "wait a while and see").
        await until(lambda: len(seeds()) >= 3, "groups 0-2 to start", state=seeds)
        before = seeds(), producer.next_dispatch
        await producer.step_done(1)
        await until(lambda: len(seeds()) >= 4, "group 3 to start after a step", state=seeds)
        after = seeds(), producer.next_dispatch
        await producer.stop()
        return before, after

    before, after = asyncio.run(run())
    assert before == ([0, 1, 2], 3)  # g // 1 <= steps_done + 2
    assert after == ([0, 1, 2, 3], 4)


def test_no_group_is_dispatched_for_a_step_that_will_not_come():
    # 2 steps of 1 group, 5 steps of staleness allowed: groups 0 and 1 only (issue 32: a run
    # recorded 385 rollouts for 384 trained, the rest of a group no step would take).
    source = ReplaySource(lambda s, k: None, lambda s, k: 1.0)

    async def run():
        producer = _producer(source, max_staleness=5, end_group=2)
        producer.start()
        released = [(await producer.next_group()).index for _ in range(2)]
        # Dispatching is one burst before any rollout runs (see above): both groups finished,
        # so every group the producer would ever admit has been dispatched by now.
        dispatched = producer.next_dispatch
        await producer.stop()
        return released, dispatched

    released, dispatched = asyncio.run(run())
    assert released == [0, 1] and dispatched == 2
    assert sorted({s for s, _ in source.calls}) == [0, 1]


def _tasks_trained(seed: int | None, groups: int, n: int = 6, start_group: int = 0) -> list[str]:
    """The tasks a producer hands its source for groups [start_group, groups), in order."""
    source = ReplaySource(lambda s, k: None, lambda s, k: 1.0)
    dataset = [f"task-{i}" for i in range(n)]

    async def run():
        producer = _producer(source, num_generations=1, max_staleness=groups,
                             start_group=start_group, train_dataset=dataset,
                             task_order_seed=seed)
        producer.start()
        tasks = [(await producer.next_group()).results[0].task_id
                 for _ in range(groups - start_group)]
        await producer.stop()
        return tasks

    return asyncio.run(run())


def test_each_epoch_visits_every_task_once_in_an_order_the_seed_chooses():
    plain = _tasks_trained(None, 12)
    assert plain == [f"task-{i % 6}" for i in range(12)]  # no seed: the dataset's order
    seed0, seed1 = _tasks_trained(0, 12), _tasks_trained(1, 12)
    for order in (seed0, seed1):
        assert sorted(order[:6]) == sorted(order[6:]) == sorted(plain[:6])  # each epoch: all
        assert order[:6] != order[6:]  # a fresh order each epoch
    assert seed0 != seed1 and seed0 != plain
    assert _tasks_trained(0, 12) == seed0  # the same seed, the same schedule
    # A resumed run (start_group = the checkpoint's data position) trains what the rest of the
    # uninterrupted one trained, also across an epoch's edge.
    assert _tasks_trained(0, 12, start_group=4) == seed0[4:]


def test_the_trainer_shuffles_its_dataset_by_seed_unless_told_not_to(tmp_path):
    def trained(**cfg) -> list[str | None]:
        source = replay_source()
        tasks: list = []
        replay = source.rollout

        async def recording(task=None, seed=None, episode_id=None):
            tasks.append(task)
            return await replay(task=task, seed=seed, episode_id=episode_id)

        source.rollout = recording
        args = AsyncGRPOConfig(**{"num_generations": 2, "max_steps": 4, "learning_rate": 1e-3,
                                  "output_dir": str(tmp_path / str(cfg)), "report_to": "none",
                                  "max_staleness": 0, **cfg})
        HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: source, args,
                                train_dataset=[f"t{i}" for i in range(4)]).train()
        return tasks[::2]  # one task a group (both its rollouts share it)

    assert trained(shuffle_dataset=False) == ["t0", "t1", "t2", "t3"]
    shuffled = trained(seed=1)
    assert sorted(shuffled) == ["t0", "t1", "t2", "t3"] and shuffled != ["t0", "t1", "t2", "t3"]


_KILLED_RUN = """
import random, sys, time
sys.path.insert(0, {repo!r})
from tests.helpers.trainer import replay_source, seeded_tiny_model
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer
src = replay_source()
slow = src.rollout
async def rollout(task=None, seed=None, episode_id=None):
    if seed >= 3:
        time.sleep(60)  # the kill lands here, with groups in flight and a step pending
    return await slow(task=task, seed=seed, episode_id=episode_id)
src.rollout = rollout
args = AsyncGRPOConfig(num_generations=2, max_steps=6, learning_rate=1e-2, save_steps=1,
                       output_dir={out!r}, report_to="none", save_total_limit=None)
HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: src, args).train()
"""


def test_resume_after_a_kill_reproduces_the_data_position_and_the_weights(tmp_path):
    out = tmp_path / "killed"
    script = _KILLED_RUN.format(repo=str(REPO), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    def at_checkpoint_3() -> bool:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        latest = out / "latest"  # rewritten after the checkpoint folder is renamed into place
        return latest.exists() and latest.read_text().strip() == "checkpoint-3"

    try:
        # Then the run waits on group 3's rollouts (they never return): the kill lands there.
        wait_until(at_checkpoint_3, "the run to complete its third checkpoint", timeout_s=240,
                   interval_s=0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    resumed = make_trainer(seeded_tiny_model(), out, source=replay_source(), max_steps=5,
                       save_steps=1, resume_from_checkpoint=True)
    assert (resumed.state.step, resumed.state.next_group_index) == (3, 3)
    pushed: list[int] = []
    resumed.weight_sync = type("Sync", (), {"push": lambda self, m, v: pushed.append(v)})()
    tail = resumed.train()
    assert pushed == [3, 4, 5]  # the checkpoint's weights reach the engine before any rollout
    straight = make_trainer(seeded_tiny_model(), tmp_path / "straight", source=replay_source(),
                        max_steps=5)
    full = straight.train()
    assert [h["data/first_group"] for h in tail] == [3.0, 4.0]
    assert [h["data/first_group"] for h in full] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [h["loss"] for h in tail] == pytest.approx([h["loss"] for h in full[3:]], abs=1e-6)
    for a, b in zip(resumed.model.parameters(), straight.model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
