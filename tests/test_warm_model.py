# .venv/bin/python -m pytest tests/test_warm_model.py -q
"""The default model is the committed warm start, hashed, built from train instances only.

`python -m harness.train` starts from models/tiny-qwen3-create-file (launchers/warm_model.py):
the tiny model fine-tuned on traces a scripted policy left through the capture proxy on the
create-file family's *train* instances. What must hold without rebuilding it (~5 min): it is what
`--model` resolves to by default, every file matches its BUILD.json sha256 (a changed file is
refused by name), the build record says it saw exactly the train instances, and its own probe
left the held-out pass rate in the band RL can move (neither 0 nor near 1).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.tasks.family import NAMES, WORDS, family_tasks
from launchers.models import resolve_model
from launchers.tiny_model import COMMITTED_MODEL, TinyModelError
from launchers.warm_model import REBUILD, WARM_MODEL, committed_warm_model, synthetic_instructions
from trainer.loop import _pack_budget
from trainer.rows import Row


def test_the_default_model_is_the_committed_warm_start_with_every_file_hashed() -> None:
    resolved = resolve_model(None)
    assert resolved.path == WARM_MODEL and resolved.source == "tiny"
    build = json.loads((WARM_MODEL / "BUILD.json").read_text())
    on_disk = {p.name for p in WARM_MODEL.iterdir() if p.is_file() and p.name != "BUILD.json"}
    assert on_disk == set(build["files"]) and {"model.safetensors", "tokenizer.json"} <= on_disk
    assert build["built_by"] == REBUILD and build["base"] == COMMITTED_MODEL.name
    # The same tokenizer as the base: the engine, the proxy's ids and the trainer agree.
    assert (WARM_MODEL / "tokenizer.json").read_bytes() == (
        COMMITTED_MODEL / "tokenizer.json").read_bytes()


def test_it_saw_the_train_instances_only_and_left_rl_room_on_the_held_out_ones() -> None:
    build = json.loads((WARM_MODEL / "BUILD.json").read_text())
    assert build["captured_rollouts"] == len(family_tasks("train"))
    probe = build["first_turn_probe"]
    assert probe["before"]["heldout"]["pass"] == 0.0  # the tiny model alone cannot do it
    assert 0.1 <= probe["after"]["heldout"]["pass"] <= 0.6, probe
    assert 0.1 <= probe["after"]["train"]["pass"] <= 0.6, probe  # and not memorised either
    # It reads: on held-out pairs it names the instruction's word or file well above the 1 in 4
    # a model that ignored the instruction would (the build before synthetic words: word 19%).
    assert max(probe["after"]["heldout"]["word"], probe["after"]["heldout"]["file"]) >= 0.5
    assert build["synthetic"] > 0 and build["bare_steps"] > 0


def test_the_synthetic_instructions_teach_no_family_word_or_name() -> None:
    """The warm start's extra instructions: outside the family, so no held-out answer is in them."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(WARM_MODEL).get_vocab()
    made = synthetic_instructions(vocab, 600, 0)
    assert made == synthetic_instructions(vocab, 600, 0)  # seeded: the build is reproducible
    family = set(WORDS) | set(NAMES) | {Path(n).stem for n in NAMES}
    assert not {w for _, w, _ in made} & family and not {n for n, _, _ in made} & family
    assert len({w for _, w, _ in made}) > 60 and len({n for n, _, _ in made}) > 60
    for name, word, instruction in made:
        assert name in instruction and word in instruction
    with pytest.raises(RuntimeError, match="need 360"):
        synthetic_instructions(["Ġhello", "Ġthere"], 10, 0)


def test_a_joined_word_that_spells_a_family_word_is_refused(monkeypatch) -> None:
    """Two pieces can join into a family word; the build must stop, not teach its answer."""
    from transformers import AutoTokenizer

    import harness.tasks.family as family

    vocab = AutoTokenizer.from_pretrained(WARM_MODEL).get_vocab()
    joined = next(w for _, w, _ in synthetic_instructions(vocab, 600, 0) if len(w) > 7)
    monkeypatch.setattr(family, "WORDS", (*family.WORDS, joined))
    with pytest.raises(RuntimeError, match=f"{joined}.*are the family's"):
        synthetic_instructions(vocab, 600, 0)


def test_a_changed_file_of_the_warm_model_is_refused_by_name(tmp_path: Path) -> None:
    copy = tmp_path / "warm"
    shutil.copytree(WARM_MODEL, copy)
    assert committed_warm_model(copy) == copy
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(TinyModelError, match=f"model.safetensors does not match.*{REBUILD}"):
        committed_warm_model(copy)
    with pytest.raises(TinyModelError, match=REBUILD):
        committed_warm_model(tmp_path / "absent")


def test_on_cpu_a_micro_batch_is_no_longer_than_the_longest_row() -> None:
    """sdpa's block mask costs the square of the whole pack: on CPU, pack only up to one row."""

    def row(n: int) -> Row:
        return Row(input_ids=[1] * n, loss_mask=[1] * n, behaviour_logprobs=[0.0] * n,
                   version_start=[0] * n, version_end=[0] * n, rollout_id="r", group_index=0)

    model = torch.nn.Linear(2, 2)
    assert _pack_budget(model, [row(1400), row(300), row(900)], 8192) == 1400
    assert _pack_budget(model, [row(9000)], 8192) == 8192  # never above the configured budget
    assert _pack_budget(model, [], 8192) == 8192
