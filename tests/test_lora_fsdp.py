# nice -n 15 .venv/bin/python -m pytest tests/test_lora_fsdp.py -q -x
"""LoRA under torchrun (gloo, FSDP2): two ranks train the adapters like one process, the frozen
base stays frozen, and rank 0 pushes and exports the gathered adapters alone.

Same shape as tests/test_trainer_fsdp.py (which proves it for full fine-tuning).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.ranks import run_ranks

SCRIPT = """
import json, torch, torch.distributed as dist
from tests.helpers.trainer import replay_source, seeded_tiny_model
from trainer.config import AsyncGRPOConfig
from trainer.grpo import HarnessAsyncGRPOTrainer

class RecordingSync:
    def __init__(self):
        self.pushed = {}
    def push(self, model, version):
        self.pushed[version] = {n: t.clone() for n, t in model.named_parameters()}

sync = RecordingSync()
args = AsyncGRPOConfig(num_generations=4, groups_per_step=2, max_steps=2, learning_rate=1e-2,
                       max_tokens_per_microbatch=64, output_dir=OUT, report_to="none",
                       dist_timeout_s=120, lora_rank=8, dtype=DTYPE)
trainer = HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: replay_source(), args,
                                  weight_sync=sync)
frozen_before = {n: p.to_local().clone() if hasattr(p, "to_local") else p.detach().clone()
                 for n, p in trainer.model.named_parameters() if not p.requires_grad}
history = trainer.train()
frozen_moved = [n for n, p in trainer.model.named_parameters() if not p.requires_grad
                and not torch.equal(p.to_local() if hasattr(p, "to_local") else p.detach(),
                                    frozen_before[n])]
rank = dist.get_rank() if dist.is_initialized() else 0
if rank == 0:
    torch.save({"pushed": sync.pushed, "frozen_moved": frozen_moved,
                "dtypes": sorted({str(p.dtype) + ("/train" if p.requires_grad else "/frozen")
                                  for p in trainer.model.parameters()}),
                "sharded": sum(hasattr(p, "to_local") for p in trainer.model.parameters()),
                "units": sum(type(m).__name__.startswith("FSDP") for m in trainer.model.modules())},
               OUT + "/pushed.pt")
    json.dump(history, open(OUT + "/history.json", "w"))
    print("ranks", dist.get_world_size() if dist.is_initialized() else 1)
if dist.is_initialized():
    dist.destroy_process_group()
"""


def _run(tmp_path: Path, nproc: int, dtype: str = "float32") -> tuple[list[dict], dict, Path]:
    out = tmp_path / f"n{nproc}-{dtype}"
    rc, text = run_ranks(f"DTYPE = {dtype!r}\n" + SCRIPT, out, nproc=nproc, timeout=500)
    assert rc == 0, text[-6000:]
    assert f"ranks {nproc}" in text
    return json.loads((out / "history.json").read_text()), torch.load(out / "pushed.pt"), out


@pytest.mark.slow
def test_two_fsdp_ranks_train_lora_adapters_like_one_process_and_push_them_alone(tmp_path):
    one_hist, one, _ = _run(tmp_path, 1)
    two_hist, two, out = _run(tmp_path, 2)
    assert two["sharded"] > 0 and two["units"] >= 3  # each decoder layer and the root
    assert two_hist[0]["packing/microbatches"] >= 2  # the work really was split over ranks
    assert [h["loss"] for h in two_hist] == pytest.approx([h["loss"] for h in one_hist],
                                                          abs=1e-5)
    assert one["frozen_moved"] == two["frozen_moved"] == []
    assert sorted(two["pushed"]) == [1, 2]
    names = set(one["pushed"][2])
    assert names == set(two["pushed"][2]) and all("lora_" in n for n in names)
    for name, full in one["pushed"][2].items():
        gathered = two["pushed"][2][name]
        assert not hasattr(gathered, "full_tensor") and gathered.shape == full.shape, name
        assert torch.allclose(gathered, full, atol=1e-4), name  # tolerance: test_trainer_fsdp's
    # the export after the last step: the gathered adapters as a peft folder, on rank 0
    assert (out / "model" / "adapter_config.json").is_file()
    assert (out / "model" / "adapter_model.safetensors").is_file()


@pytest.mark.slow
def test_bf16_lora_under_fsdp2_keeps_a_bf16_frozen_base_beside_fp32_adapters(tmp_path):
    # FSDP2 wants one dtype among a unit's TRAINABLE parameters only; the frozen bf16 base and
    # the fp32 adapters share each decoder layer's unit (trainer/lora.py)
    one_hist, one, _ = _run(tmp_path, 1, "bfloat16")  # autocast on one process
    two_hist, two, _ = _run(tmp_path, 2, "bfloat16")  # MixedPrecisionPolicy(bf16, reduce fp32)
    assert one["dtypes"] == two["dtypes"] == ["torch.bfloat16/frozen", "torch.float32/train"]
    assert {t.dtype for t in two["pushed"][2].values()} == {torch.bfloat16}  # cast for the engine
    # two ways of computing in bf16 (op-level autocast, module-level FSDP casts): close losses
    assert [h["loss"] for h in two_hist] == pytest.approx([h["loss"] for h in one_hist],
                                                          abs=2e-2)
    assert one["frozen_moved"] == two["frozen_moved"] == []
