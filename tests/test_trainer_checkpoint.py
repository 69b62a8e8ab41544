"""Sharded checkpoints on two gloo ranks: each rank writes its shards, a resumed run takes the
same next step as an uninterrupted one, and the final model is exported in HF layout.

Run: .venv/bin/python -m pytest tests/test_trainer_checkpoint.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.ranks import run_ranks

SCRIPT = """
import json
import torch.distributed as dist
from tests.helpers.trainer import replay_source, seeded_tiny_model
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer

def train(name, **cfg):
    args = AsyncGRPOConfig(**{"num_generations": 4, "groups_per_step": 2, "learning_rate": 1e-2,
                              "max_tokens_per_microbatch": 64, "output_dir": OUT + "/" + name,
                              "report_to": "none", "optimizer": OPTIMIZER, **cfg})
    trainer = HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: replay_source(), args)
    return trainer, trainer.train()

_, straight = train("straight", max_steps=3)
_, first = train("killed", max_steps=2, save_steps=2, export_model=False)
resumed, tail = train("killed", max_steps=3, save_steps=2, resume_from_checkpoint=True)
if dist.get_rank() == 0:
    json.dump({"straight": straight, "first": first, "tail": tail,
               "resumed_at": [resumed.state.step, resumed.state.next_group_index]},
              open(OUT + "/histories.json", "w"))
dist.destroy_process_group()
print("rank", dist.get_rank() if dist.is_initialized() else "-", "done")
"""


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])  # sgd: a checkpoint with no optimizer state
def test_sharded_save_and_resume_on_two_ranks_take_the_same_next_step(tmp_path, optimizer):
    out = tmp_path / "ckpt"
    rc, text = run_ranks(f"OPTIMIZER = {optimizer!r}\n" + SCRIPT, out, nproc=2, timeout=600)
    assert rc == 0, text[-4000:]
    runs = json.loads((out / "histories.json").read_text())
    assert runs["first"][0]["packing/microbatches"] >= 2  # the step really was split over ranks
    assert [h["loss"] for h in runs["first"]] == pytest.approx(
        [h["loss"] for h in runs["straight"][:2]], abs=1e-6)
    # The resumed run continues from checkpoint-2: step 3 on group 4 (2 groups a step) ...
    assert len(runs["tail"]) == 1 and runs["tail"][0]["data/first_group"] == 4.0
    # ... with the same loss and gradient as the run that was never interrupted.
    assert runs["tail"][0]["loss"] == pytest.approx(runs["straight"][2]["loss"], abs=1e-6)
    assert runs["tail"][0]["grad_norm"] == pytest.approx(runs["straight"][2]["grad_norm"],
                                                         rel=1e-5)
    # Sharded: each rank wrote its own shard file; no full model file in a checkpoint.
    ckpt = out / "killed" / "checkpoint-2"
    assert sorted(p.name for p in (ckpt / "dcp").glob("*.distcp")) == ["__0_0.distcp",
                                                                      "__1_0.distcp"]
    assert sorted(p.name for p in (ckpt / "rng").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert not list(ckpt.rglob("*.safetensors"))
    assert (out / "killed" / "latest").read_text() == "checkpoint-3"
    # The final model, exported whole in HF layout, loads with from_pretrained and has trained.
    from transformers import AutoModelForCausalLM

    from tests.helpers.trainer import seeded_tiny_model

    exported = AutoModelForCausalLM.from_pretrained(str(out / "straight" / "model"))
    init = seeded_tiny_model()
    moved = [not torch.equal(a, b) for a, b in zip(exported.parameters(), init.parameters(),
                                                    strict=True)]
    assert all(moved)
    assert not (out / "killed" / "checkpoint-2" / "model").exists()
