"""Holes that used to hang or load silently: datasets, rollout threads, checkpoints.

- an empty train_dataset is refused before the model loads; one whose items raise stops the run
  at once with the index named (it used to leave the trainer waiting for a group forever);
- blocking rollouts run on an executor of their own with `max_concurrent_rollouts` threads
  (asyncio's shared default pool has CPUs + 4 threads: 6 here, so 8 rollouts ran 6 at a time);
- a checkpoint is checked on load: its keys against the model's, its world size, its fields.

Run: .venv/bin/python -m pytest tests/test_trainer_robustness.py -q
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading

import pytest
import torch

from tests.helpers.trainer import replay_source, seeded_tiny_model
from trainer.checkpoint import load_checkpoint
from trainer.config import AsyncGRPOConfig
from trainer.distributed import placement
from trainer.errors import CheckpointError, ConfigError, TrainerError
from trainer.fakes import synthetic_trace
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.rollouts import RolloutExecutor, SessionDriver


def _args(tmp_path, **kw) -> AsyncGRPOConfig:
    return AsyncGRPOConfig(**{"num_generations": 2, "max_steps": 2, "learning_rate": 1e-3,
                              "output_dir": str(tmp_path), "report_to": "none", **kw})


# --- train_dataset -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("dataset", "message"), [
    ([], "train_dataset is empty"),
    (iter(["task"]), "has no len()"),
])
def test_an_empty_or_unsized_train_dataset_is_refused_before_the_model_loads(tmp_path, dataset,
                                                                              message):
    class NeverLoaded(torch.nn.Module):
        def float(self):
            raise AssertionError("the model was touched before the dataset was checked")

    with pytest.raises(ConfigError, match=message):
        HarnessAsyncGRPOTrainer(NeverLoaded(), lambda sampling: replay_source(), _args(tmp_path),
                                train_dataset=dataset)


class _BrokenAt:
    """Three tasks; reading task `bad` raises, as a lazy dataset with a missing file does."""

    def __init__(self, bad: int):
        self.bad = bad

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> str:
        if i == self.bad:
            raise FileNotFoundError(f"tasks/{i}/task.toml")
        return f"task-{i}"


def test_a_train_dataset_that_raises_stops_the_run_at_once_naming_the_item(tmp_path):
    # In the dataset's order, group 1 (trained in step 2 of 2) reads the broken item.
    trainer = HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: replay_source(),
                                      _args(tmp_path, shuffle_dataset=False),
                                      train_dataset=_BrokenAt(1))
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            trainer.train()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=120)  # generous: the failure is immediate; a hang never ends
    assert not worker.is_alive(), "train() was still waiting 120 s after the dataset failed"
    assert isinstance(outcome[0], TrainerError)
    assert "train_dataset[1]" in str(outcome[0]) and "task.toml" in str(outcome[0])


# --- the rollout executor ------------------------------------------------------------------------------
class _GatedSession:
    """wait_for_completion returns only once `parties` sessions are waiting at the same time."""

    def __init__(self, gate: threading.Barrier, counter: dict):
        self.gate, self.counter = gate, counter

    def wait_for_completion(self, timeout_s=None):
        with self.counter["lock"]:
            self.counter["now"] += 1
            self.counter["max"] = max(self.counter["max"], self.counter["now"])
        try:
            self.gate.wait()
        finally:
            with self.counter["lock"]:
                self.counter["now"] -= 1
        return 0

    def fetch_training_trace(self):
        return synthetic_trace(random.Random(0))

    def verify(self, completion):
        return type("V", (), {"env_reward": 1.0})()

    def close(self):
        pass


def test_the_session_driver_runs_max_concurrent_rollouts_at_once_and_no_more():
    # 8 sessions must be inside wait_for_completion together for any to finish (barrier of 8).
    gate = threading.Barrier(8, timeout=60)
    counter = {"lock": threading.Lock(), "now": 0, "max": 0}
    factory = type("F", (), {"create": lambda self, task, seed=None, episode_id=None:
                             _GatedSession(gate, counter)})()
    driver = SessionDriver(factory, max_concurrent=8)

    async def run():
        return await asyncio.gather(*(driver.rollout(seed=i) for i in range(16)))

    results = asyncio.run(run())
    assert [r.cause for r in results] == ["ok"] * 16  # no broken barrier: 8 ran at once
    assert counter["max"] == 8
    assert driver.executor.max_workers == 8
    assert all(t.daemon for t in driver.executor._threads)  # a hung agent never blocks exit
    driver.close()


def test_the_rollout_executor_returns_results_and_errors_and_refuses_work_after_shutdown():
    pool = RolloutExecutor(2)
    assert pool.submit(lambda a, b: a + b, 2, b=3).result(timeout=30) == 5
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=30)
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(print)


# --- placement: the one place the CPU and the GPU runs differ -------------------------------------------
def test_cuda_ranks_get_nccl_for_gpu_tensors_and_gloo_for_objects_cpu_ranks_gloo():
    device, backend, _ = placement(True, 3)
    assert (str(device), backend) == ("cuda:3", "cpu:gloo,cuda:nccl")
    device, backend, _ = placement(False, 3)
    assert (str(device), backend) == ("cpu", "gloo")


# --- checkpoints are checked on load ----------------------------------------------------------------------
def _saved(tmp_path):
    trainer = HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: replay_source(),
                                      _args(tmp_path, max_steps=1))
    trainer.train()
    return trainer, tmp_path / "checkpoint-1"


def test_a_checkpoint_of_another_model_is_refused_naming_the_keys(tmp_path):
    trainer, path = _saved(tmp_path)
    from transformers import Qwen3Config, Qwen3ForCausalLM

    other = Qwen3ForCausalLM(Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=3, num_attention_heads=2,
                                         num_key_value_heads=1, head_dim=32,
                                         tie_word_embeddings=True))
    before = [p.detach().clone() for p in other.parameters()]
    with pytest.raises(CheckpointError, match=r"\d+ missing, e\.g\. \['model\.layers\.2\."):
        load_checkpoint(path, model=other, optimizer=torch.optim.AdamW(other.parameters()),
                        scheduler=None, dist_info=trainer.dist)
    assert all(torch.equal(a, b) for a, b in zip(before, other.parameters(), strict=True))


def test_a_checkpoint_from_another_world_size_loads_with_a_warning(tmp_path, caplog):
    trainer, path = _saved(tmp_path)
    blob = torch.load(path / "trainer_state.pt", weights_only=False)
    blob["world_size"] = 4
    torch.save(blob, path / "trainer_state.pt")
    model = seeded_tiny_model()
    with caplog.at_level(logging.WARNING, logger="trainer.checkpoint"):
        state = load_checkpoint(path, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                scheduler=None, dist_info=trainer.dist)
    assert state.step == 1
    assert "saved by 4 rank(s) and is resumed on 1" in caplog.text
    for a, b in zip(model.parameters(), trainer.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda blob: blob.pop("world_size"), r"lacks \['world_size'\]"),
    (lambda blob: blob.update(world_size=0), "world_size 0 .* is not a rank count"),
])
def test_a_checkpoint_without_a_valid_world_size_is_refused(tmp_path, edit, message):
    trainer, path = _saved(tmp_path)
    blob = torch.load(path / "trainer_state.pt", weights_only=False)
    edit(blob)
    torch.save(blob, path / "trainer_state.pt")
    model = seeded_tiny_model()
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path, model=model, optimizer=torch.optim.AdamW(model.parameters()),
                        scheduler=None, dist_info=trainer.dist)


def test_a_partly_read_weight_stream_leaves_autograd_on() -> None:
    # Grad mode is per-thread state: a gather generator suspended inside no_grad once left the
    # trainer's thread without autograd, and the next step's backward failed ("element 0 of
    # tensors does not require grad") three steps into a real run.
    import torch

    from trainer.weight_sync.source import FullModelView, iter_full_parameters

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    view = FullModelView(model)
    stream = view.named_parameters()
    name, tensor = next(stream)
    assert not tensor.requires_grad
    assert torch.is_grad_enabled(), "a suspended weight stream switched autograd off"
    next(iter_full_parameters(model))
    assert torch.is_grad_enabled()
    loss = model(torch.ones(1, 4)).sum()
    loss.backward()  # what failed before
    assert model[0].weight.grad is not None
