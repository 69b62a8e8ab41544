"""Two processes under torchrun (gloo, FSDP2) train exactly like one, and weight sync gathers
full parameters to rank 0.

Run: .venv/bin/python -m pytest tests/test_trainer_fsdp.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, torch, torch.distributed as dist
sys.path.insert(0, {repo!r}); sys.path.insert(0, {tests!r})
from test_trainer_step import _seeded_tiny_model, _source
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer

class RecordingSync:
    def __init__(self):
        self.pushed = {{}}
    def push(self, model, version):
        self.pushed[version] = {{k: v.clone() for k, v in model.named_parameters()}}

sync = RecordingSync()
args = AsyncGRPOConfig(num_generations=4, groups_per_step=2, max_steps=2, learning_rate=1e-2,
                       max_tokens_per_microbatch=64, output_dir={out!r}, report_to="none")
trainer = HarnessAsyncGRPOTrainer(_seeded_tiny_model(), lambda sampling: _source(), args,
                                  weight_sync=sync)
history = trainer.train()
rank = dist.get_rank() if dist.is_initialized() else 0
if rank == 0:
    torch.save(sync.pushed, {out!r} + "/pushed.pt")
    json.dump(history, open({out!r} + "/history.json", "w"))
    print("ranks", dist.get_world_size() if dist.is_initialized() else 1)
if dist.is_initialized():
    dist.destroy_process_group()
"""


def _run(tmp_path: Path, nproc: int) -> tuple[list[dict], dict]:
    out = tmp_path / f"n{nproc}"
    out.mkdir()
    script = out / "train.py"
    script.write_text(SCRIPT.format(repo=str(REPO), tests=str(REPO / "tests"), out=str(out)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if nproc == 1:
        cmd = [sys.executable, str(script)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(nproc), str(script)]
    # A session of its own, so a hang kills torchrun's workers too, not only torchrun.
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert f"ranks {nproc}" in stdout
    history = json.loads((out / "history.json").read_text())
    return history, torch.load(out / "pushed.pt")


@pytest.mark.slow
def test_two_fsdp_ranks_on_gloo_train_like_one_process_and_push_full_weights_from_rank_0(
        tmp_path):
    one_hist, one_pushed = _run(tmp_path, 1)
    two_hist, two_pushed = _run(tmp_path, 2)
    assert two_hist[0]["packing/microbatches"] >= 2  # the work really was split over ranks
    assert [h["loss"] for h in two_hist] == pytest.approx([h["loss"] for h in one_hist],
                                                          abs=1e-5)
    assert sorted(two_pushed) == [1, 2]
    for name, full in one_pushed[2].items():
        gathered = two_pushed[2][name]
        assert not hasattr(gathered, "full_tensor") and gathered.shape == full.shape, name
        assert torch.allclose(gathered, full, atol=1e-5), name
