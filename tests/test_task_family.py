# Run: .venv/bin/python -m pytest tests/test_task_family.py -x -q
"""The generated create-file task family: committed set = generator output, loads as Harbor
tasks, a disjoint train/held-out split by (name, word) pair, and real verifiers that pass the
reference solution and fail wrong answers in the local sandbox (Harbor's Trial, oracle agent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.tasks import TaskSourceError, load_folder, load_tasks
from harness.tasks.family import (
    FAMILY_DIR,
    NAMES,
    TEMPLATES,
    WORDS,
    family_tasks,
    generate,
    instances,
    main,
)
from tests.helpers.task_folders import folder_files, trial_reward, with_solution


def test_the_committed_set_is_exactly_what_the_generator_writes(tmp_path: Path):
    generate(tmp_path / "fresh")
    assert folder_files(tmp_path / "fresh") == folder_files(FAMILY_DIR), (
        "harness/tasks/families/create-file is stale: regenerate it with "
        "`python -m harness.tasks.family --out harness/tasks/families/create-file --overwrite`")


def test_both_splits_load_like_any_harbor_task_folder():
    train, heldout = family_tasks("train"), family_tasks("heldout")
    assert (len(train), len(heldout)) == (36, 12)
    assert len(load_folder(FAMILY_DIR / "heldout")) == 12
    assert len(load_tasks(str(FAMILY_DIR / "train"), count=5)) == 5
    for task in train + heldout:
        meta = task.metadata
        assert task.has_solution
        assert meta["file"] in task.instruction and meta["word"] in task.instruction
        assert task.instruction.strip() == TEMPLATES[meta["template"]].format(name=meta["file"],
                                                                       word=meta["word"])
    assert {t.metadata["split"] for t in train} == {"train"}
    assert {t.metadata["split"] for t in heldout} == {"heldout"}


def test_the_split_is_disjoint_and_held_out_pairs_are_new_combinations():
    train, heldout = family_tasks("train"), family_tasks("heldout")
    pairs = lambda tasks: {(t.metadata["file"], t.metadata["word"]) for t in tasks}  # noqa: E731
    assert not {t.name for t in train} & {t.name for t in heldout}
    assert not pairs(train) & pairs(heldout)
    assert len(pairs(train)) + len(pairs(heldout)) == len(NAMES) * len(WORDS)
    # Every name and word is held out exactly once and still seen in train.
    assert sorted(n for n, _ in pairs(heldout)) == sorted(NAMES)
    assert sorted(w for _, w in pairs(heldout)) == sorted(WORDS)
    assert {n for n, _ in pairs(train)} == set(NAMES) and {w for _, w in pairs(train)} == set(WORDS)
    # Every template on both sides: held-out tests the pair, not an unseen phrasing.
    for tasks in (train, heldout):
        assert {t.metadata["template"] for t in tasks} == set(range(len(TEMPLATES)))


def test_the_seed_picks_other_held_out_pairs_and_always_a_permutation():
    seen = set()
    for seed in range(6):
        held = {(i.name, i.word) for i in instances(seed=seed) if i.split == "heldout"}
        assert sorted(n for n, _ in held) == sorted(NAMES)
        assert sorted(w for _, w in held) == sorted(WORDS)
        seen.add(frozenset(held))
    assert len(seen) > 1
    assert instances(seed=3) == instances(seed=3)


def test_bad_vocabulary_and_unsafe_overwrites_are_refused(tmp_path: Path):
    with pytest.raises(TaskSourceError, match="as many names as words"):
        instances(names=["a.txt", "b.txt"], words=["x"])
    with pytest.raises(TaskSourceError, match="shell scripts"):
        instances(names=["a.txt", "b;rm.txt"], words=["x", "y"])
    with pytest.raises(TaskSourceError, match="use one of"):
        family_tasks("test")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not the generator's")
    with pytest.raises(TaskSourceError, match="not empty"):
        generate(foreign)
    with pytest.raises(TaskSourceError, match="did not write"):
        generate(foreign, overwrite=True)
    assert (foreign / "keep.txt").exists()


def test_the_cli_writes_a_family_and_refuses_to_clobber_it(tmp_path: Path, capsys):
    out = tmp_path / "fam"
    assert main(["--out", str(out), "--seed", "1"]) == 0
    assert "36 train and 12 held-out" in capsys.readouterr().out
    assert main(["--out", str(out)]) == 2
    assert main(["--out", str(out), "--overwrite"]) == 0
    assert len(load_folder(out / "heldout")) == 12


@pytest.mark.parametrize("split,task", [("heldout", "create-answer-hello-t1"),
                                        ("train", "create-out-done-t2"),
                                        ("train", "create-notes-42-t0")])
async def test_the_reference_solution_passes_its_real_verifier(split: str, task: str,
                                                               tmp_path: Path):
    assert await trial_reward(FAMILY_DIR / split / task, tmp_path) == 1


@pytest.mark.parametrize("solve", [
    "echo world > /app/answer.txt",              # the wrong word
    "echo hello > /app/hello.txt",               # the right word in the wrong file
    "printf 'hello\\nhello\\n' > /app/answer.txt",  # extra content
    "echo hello world > /app/answer.txt",
])
async def test_wrong_answers_fail_the_real_verifier(solve: str, tmp_path: Path):
    task = with_solution(FAMILY_DIR / "heldout" / "create-answer-hello-t1", tmp_path, solve)
    assert await trial_reward(task, tmp_path / "trials") == 0


async def test_doing_nothing_fails(tmp_path: Path):
    assert await trial_reward(FAMILY_DIR / "heldout" / "create-out-42-t0", tmp_path, "nop") == 0
