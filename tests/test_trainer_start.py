"""Start-up under torchrun: rank 0's long work before training never times the followers out.

harness.train joins every rank to the process groups first (`join_ranks`), then rank 0 starts
the engine, the rollout service and the held-out "before" evaluation, which take minutes. The
followers wait for it in the trainer's start-up barrier on the control group
(step_wait_timeout_s), not in the rendezvous or a step collective bounded by dist_timeout_s
(issue 30). Before, the followers entered init_process_group at once and rank 0 only after its
start-up: past dist_timeout_s they died.

Run: .venv/bin/python -m pytest tests/test_trainer_start.py -q
"""

from __future__ import annotations

import json

import pytest

from tests.helpers.ranks import run_ranks

SCRIPT = """
import json, os, time
import torch.distributed as dist
from tests.helpers.trainer import replay_source, seeded_tiny_model
from trainer.config import AsyncGRPOConfig
from harness.train import join_ranks
from trainer.grpo import HarnessAsyncGRPOTrainer

args = AsyncGRPOConfig(num_generations=2, max_steps=2, learning_rate=1e-2, output_dir=OUT,
                       report_to="none", dist_timeout_s=DIST_TIMEOUT_S)
join_ranks(args)  # what harness.train does first, on every rank
rank = dist.get_rank()
if rank == 0:
    # Rank 0's pre-training work (engine, service, "before" eval), three step timeouts long.
    # Busy work, not a sleep: the point is a rank that is alive and late.
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < LATE_S:
        n += sum(range(1000))
    open(OUT + "/late_s", "w").write(repr(time.monotonic() - t0))
trainer = HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: replay_source(), args)
history = trainer.train()
if rank == 0:
    json.dump(history, open(OUT + "/history.json", "w"))
dist.destroy_process_group()
# A file per rank, not a print: the ranks share one stdout pipe and their lines interleave.
open(OUT + f"/rank{rank}.done", "w").write("done")
"""


@pytest.mark.slow
def test_followers_wait_for_a_rank_0_whose_start_up_outlasts_dist_timeout(tmp_path):
    dist_timeout_s, late_s = 4.0, 12.0
    script = f"DIST_TIMEOUT_S, LATE_S = {dist_timeout_s}, {late_s}\n" + SCRIPT
    rc, text = run_ranks(script, tmp_path / "late", nproc=2)
    assert rc == 0, text[-4000:]
    assert all((tmp_path / "late" / f"rank{r}.done").exists() for r in (0, 1)), text[-4000:]
    assert float((tmp_path / "late" / "late_s").read_text()) > 2 * dist_timeout_s
    history = json.loads((tmp_path / "late" / "history.json").read_text())
    assert len(history) == 2 and all(h["version"] == i + 1 for i, h in enumerate(history))
