# Run: .venv/bin/python -m pytest tests/test_task_lookup.py -x -q
"""The multi-step lookup family: committed set = generator output, three disjoint splits by
(source, target) pair, 8 contrastive instances per instruction text, the swap and blind
variants, real verifiers (Harbor's Trial in the local sandbox: the reference solution reads the
file and passes, wrong answers fail), and the per-step rates read from recorded calls."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from harness.shared.lookup_names import SOURCES, SPLITS, TARGETS, TEMPLATES, VALUES, instance_of
from harness.shared.lookup_rates import by_instruction, step_rates
from harness.tasks import TaskSourceError, load_tasks
from harness.tasks.lookup import LOOKUP_DIR, generate, instances, lookup_tasks, main, source_text
from tests.helpers.task_folders import folder_files, trial_reward, with_solution


def test_the_committed_set_is_exactly_what_the_generator_writes(tmp_path: Path):
    generate(tmp_path / "fresh")
    assert folder_files(tmp_path / "fresh") == folder_files(LOOKUP_DIR), (
        "harness/tasks/families/lookup is stale: regenerate it with "
        "`python -m harness.tasks.lookup --out harness/tasks/families/lookup --overwrite`")


def test_three_splits_load_with_disjoint_pairs_each_a_permutation():
    tasks = {s: lookup_tasks(s) for s in SPLITS}
    assert {s: len(t) for s, t in tasks.items()} == {"train": 192, "dev": 96, "test": 96}
    assert len(load_tasks("lookup:test")) == 96
    pairs = {s: {(t.metadata["source"], t.metadata["target"]) for t in ts}
             for s, ts in tasks.items()}
    assert not pairs["train"] & pairs["dev"] and not pairs["train"] & pairs["test"]
    assert not pairs["dev"] & pairs["test"]
    assert sum(len(p) for p in pairs.values()) == len(SOURCES) * len(TARGETS)
    for split in ("dev", "test"):  # each source and each target exactly once
        assert sorted(s for s, _ in pairs[split]) == sorted(SOURCES)
        assert sorted(t for _, t in pairs[split]) == sorted(TARGETS)
    for split, ts in tasks.items():  # every word and every template on every side
        assert {t.metadata["value"] for t in ts} == set(VALUES), split
        assert {t.metadata["template"] for t in ts} == set(range(len(TEMPLATES))), split
        assert {t.metadata["split"] for t in ts} == {split}


def test_every_instruction_has_eight_instances_that_differ_only_in_the_observed_word():
    for split in SPLITS:
        by_text: dict[str, list] = {}
        for task in lookup_tasks(split):
            by_text.setdefault(task.instruction, []).append(task)
            # The instruction never gives the word: it must be read from the sandbox.
            assert task.metadata["value"] not in task.instruction
            env = task.path / "environment"
            assert (env / task.metadata["source"]).read_text() == f"word: {task.metadata['value']}\n"
        for text, group in by_text.items():
            assert sorted(t.metadata["value"] for t in group) == sorted(VALUES), text
            # Same files but the source's content, the verifier's expected word and the name.
            tests = {(t.path / "tests" / "test.sh").read_text().replace(
                t.metadata["value"], "W") for t in group}
            assert len(tests) == 1


def test_the_swap_and_blind_variants_change_only_what_the_file_shows():
    plain = {(i.source, i.target, i.template, i.value): i for i in instances()}
    for inst in instances("swap"):
        base = plain[(inst.source, inst.target, inst.template, inst.value)]
        assert inst.observed != base.observed and inst.expected == inst.observed
        assert inst.instruction == base.instruction
    swapped = Counter(i.observed for i in instances("swap"))
    assert set(swapped) == set(VALUES)  # a rotation: every word still shown equally often
    for inst in instances("blind"):
        assert inst.observed == "" and inst.expected == inst.value
    assert source_text("") == "word:\n" and source_text("tree") == "word: tree\n"


def test_bad_splits_variants_and_unsafe_overwrites_are_refused(tmp_path: Path, capsys):
    with pytest.raises(TaskSourceError, match="lookup:train, lookup:dev, lookup:test"):
        lookup_tasks("heldout")
    with pytest.raises(TaskSourceError, match="variant"):
        instances("reversed")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not the generator's")
    assert main(["--out", str(foreign)]) == 2
    assert "not empty" in capsys.readouterr().err
    with pytest.raises(TaskSourceError, match="did not write"):
        generate(foreign, overwrite=True)
    assert (foreign / "keep.txt").exists()
    assert main(["--out", str(tmp_path / "swap"), "--variant", "swap"]) == 0
    assert "192 train, 96 dev, 96 test" in capsys.readouterr().out
    assert len(lookup_tasks("test", tmp_path / "swap")) == 96


def _with_solution(task_dir: Path, tmp_path: Path, solve: str) -> Path:
    return with_solution(task_dir, tmp_path, "cd /app\n" + solve)


async def test_the_reference_solution_reads_the_file_and_passes_its_real_verifier(
        tmp_path: Path):
    # The reference never names the word: it passes only because it read the file.
    assert await trial_reward(LOOKUP_DIR / "test" / "lookup-key-answer-t1-queue", tmp_path) == 1
    generate(tmp_path / "swap", variant="swap")
    swapped = tmp_path / "swap" / "test" / "lookup-key-answer-t1-queue-swap"
    assert await trial_reward(swapped, tmp_path / "t2") == 1


@pytest.mark.parametrize("solve", [
    "echo queue > result.txt",      # the right word, the wrong file
    "echo table > answer.txt",      # a guess: the word of another instance
    "echo 'queue queue' > answer.txt",
    "cat value.txt > answer.txt",   # another instance's source
])
async def test_wrong_answers_fail_the_real_verifier(solve: str, tmp_path: Path):
    task = _with_solution(LOOKUP_DIR / "test" / "lookup-key-answer-t1-queue", tmp_path, solve)
    assert await trial_reward(task, tmp_path / "trials") == 0


async def test_a_blind_instance_cannot_be_solved_by_reading(tmp_path: Path):
    generate(tmp_path / "blind", variant="blind")
    assert await trial_reward(tmp_path / "blind" / "test" / "lookup-key-answer-t1-queue-blind",
                         tmp_path / "t") == 0


def _record(task: str, reward: float | None, *commands: str) -> dict:
    turns = [{"metadata": {"aux": False}, "response": {"choices": [{"message": {"tool_calls": [
        {"id": "chatcmpl-tool-tablequeue", "function": {
            "name": "bash", "arguments": json.dumps({"command": c})}}]}}]}} for c in commands]
    return {"task_id": f"harness-lookup/{task}", "env_reward": reward, "trace": {"turns": turns}}


def test_step_rates_count_each_step_from_the_recorded_calls():
    records = [
        _record("lookup-key-answer-t0-table", 1.0, "cat key.txt", "echo table > answer.txt"),
        _record("lookup-key-answer-t0-queue", 0.0, "cat key.txt", "echo queue > out.txt"),
        _record("lookup-key-answer-t0-lock", 0.0, "ls", "echo table > answer.txt"),
        _record("lookup-key-answer-t0-tree", 1.0, "cp key.txt answer.txt"),  # one step
        _record("lookup-key-answer-t0-pipe", None, "cat key.txt"),  # unscored: left out
        {"task_id": "harness-family/create-out-42-t0", "env_reward": 1.0, "trace": None},
    ]
    # The engine's random ids never count as a mention of the word.
    assert step_rates(records) == {"looked": 0.75, "used_observation": 0.5, "passed": 0.5,
                                   "n": 4}
    swap = [_record("lookup-key-answer-t0-table-swap", 1.0, "cat key.txt",
                    "echo queue > answer.txt")]
    assert step_rates(swap)["used_observation"] == 1.0  # the word the file showed: queue
    blind = [_record("lookup-key-answer-t0-table-blind", 0.0, "cat key.txt", "echo x > a")]
    assert step_rates(blind)["used_observation"] is None
    assert step_rates(records[-1:]) is None


def test_task_names_parse_back_to_their_instances():
    for variant in ("plain", "swap", "blind"):
        for inst in instances(variant):
            parsed = instance_of(f"harness-lookup/{inst.task_name}")
            assert parsed is not None
            assert (parsed.source, parsed.target, parsed.value, parsed.template,
                    parsed.variant) == (inst.source, inst.target, inst.value, inst.template,
                                        inst.variant)
    assert instance_of("harness-family/create-out-42-t0") is None
    assert instance_of("harness-lookup/lookup-etc-answer-t0-table") is None


def test_the_test_table_sums_each_instruction_over_its_words():
    summary = {"per_task": {
        "harness-lookup/lookup-key-answer-t0-table": {"passed": 1, "scored": 1, "unscored": 0},
        "harness-lookup/lookup-key-answer-t0-queue": {"passed": 0, "scored": 1, "unscored": 1},
        "other": {"passed": 2, "scored": 2, "unscored": 0}}, "passed": 3}
    grouped = by_instruction(summary)
    assert grouped["per_task"] == {"key-answer-t0": {"passed": 1, "scored": 2, "unscored": 1},
                                   "other": {"passed": 2, "scored": 2, "unscored": 0}}
    assert grouped["passed"] == 3
