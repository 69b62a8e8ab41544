# .venv/bin/python -m pytest tests/test_warm_model.py -q
"""The default model is the committed warm start, hashed, built from train instances only.

`python -m harness.train` starts from models/tiny-qwen3-create-file (harness/warm/create_file.py):
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
from harness.warm.create_file import synthetic_instructions
from launchers.models import resolve_model
from launchers.tiny_model import COMMITTED_MODEL, TinyModelError
from launchers.warm_models import REBUILD, WARM_MODEL, committed_warm_model
from tests.helpers.teacher_forced import call_rank, encode_prompt, mini_first_request
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


def _word_ranks(model_dir: Path) -> list[int]:
    """Per held-out instance, the rank (0 = first) of its own word among the family's words, by
    the model's log-probability of the whole tool call `echo WORD > FILE` after mini-swe-agent's
    real first prompt (the recorded fixture, with the instance's instruction in it). Teacher-
    forced, so nothing sampled: the same number on every run."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.audit.scripted_engine import tool_call

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ranks = []
    for task in family_tasks("heldout"):
        prompt = encode_prompt(tok, *mini_first_request(task.instruction.strip()))
        file = task.metadata["file"]
        calls = [tok.encode(tool_call("bash", command=f"echo {w} > {file}"),
                            add_special_tokens=False) for w in WORDS]
        ranks.append(call_rank(model, prompt, calls, WORDS.index(task.metadata["word"])))
    return ranks


def test_on_held_out_instructions_the_warm_model_names_the_asked_word_and_the_base_does_not():
    """Measured from the weights, not read from BUILD.json: after mini-swe-agent's prompt the
    warm start ranks the instance's own word first on held-out instances (measured: 12 of 12),
    and the base tiny model it was built from is at chance (mean rank 1.5 of 0-3): the check
    can fail, and the warm start's word figure in BUILD.json is not a number only written."""
    warm, base = _word_ranks(WARM_MODEL), _word_ranks(COMMITTED_MODEL)
    assert sum(r == 0 for r in warm) >= 0.75 * len(warm), warm
    assert sum(base) / len(base) >= 1.0, base  # chance is (len(WORDS) - 1) / 2 = 1.5
    build = json.loads((WARM_MODEL / "BUILD.json").read_text())
    assert build["first_turn_probe"]["after"]["heldout"]["word"] >= 0.5  # agrees


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
