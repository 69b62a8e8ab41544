# Run: .venv/bin/python -m pytest tests/test_tasks_loading.py -x -q
"""Loading Harbor tasks: folders, bundled, registry datasets, HF repos; selection; typed errors.

No test here uses the network: the registry is exercised for real through a local JSON registry
(Harbor's own client and task cache), and the networked paths are checked to fail fast with
the offline fix in the message with the network blocked in-process (tests/helpers/network.py), so
they mean the same on a machine that has network.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.tasks import (
    BUNDLED_DIR,
    TaskDefinitionError,
    TaskNotFoundError,
    TaskSelectionError,
    TaskSourceError,
    TaskSourceUnavailableError,
    bundled_tasks,
    load_folder,
    load_hf,
    load_registry,
    load_source,
    load_task,
    load_tasks,
    select_tasks,
)
from tests.helpers.network import block_network


def _copy_task(tmp_path: Path, name: str = "hello-file") -> Path:
    target = tmp_path / name
    shutil.copytree(BUNDLED_DIR / name, target)
    return target


def test_at_least_six_bundled_tasks_load_each_with_a_solution():
    tasks = bundled_tasks()
    assert len(tasks) >= 6
    assert all(t.has_solution and t.instruction.strip() and t.source == "bundled" for t in tasks)
    assert len({t.name for t in tasks}) == len(tasks)


def test_bundled_tasks_give_harbors_own_task_objects():
    task = load_task(BUNDLED_DIR / "csv-report")
    harbor_task = task.harbor()
    assert harbor_task.short_name == task.name == "csv-report"
    assert task.full_name == "harness/csv-report"


def test_a_single_task_dir_loads_as_a_one_task_folder(tmp_path: Path):
    tasks = load_folder(_copy_task(tmp_path))
    assert [t.name for t in tasks] == ["hello-file"]


def test_missing_instruction_is_reported_with_its_fix(tmp_path: Path):
    task = _copy_task(tmp_path)
    (task / "instruction.md").unlink()
    with pytest.raises(TaskDefinitionError, match="missing instruction.md: write the agent"):
        load_task(task)


def test_bad_task_toml_syntax_is_reported_with_its_fix(tmp_path: Path):
    task = _copy_task(tmp_path)
    (task / "task.toml").write_text("schema_version = \n[agent\n")
    with pytest.raises(TaskDefinitionError, match="task.toml is not valid TOML"):
        load_task(task)


def test_invalid_task_toml_values_are_reported_by_harbor(tmp_path: Path):
    task = _copy_task(tmp_path)
    (task / "task.toml").write_text('[task]\nname = "no-org-slash"\n')
    with pytest.raises(TaskDefinitionError, match="org/name"):
        load_task(task)


def test_missing_test_script_names_the_reward_file_contract(tmp_path: Path):
    task = _copy_task(tmp_path)
    (task / "tests" / "test.sh").unlink()
    with pytest.raises(TaskDefinitionError, match=r"reward.txt.*reward.json"):
        load_task(task)


def test_every_broken_task_in_a_folder_is_reported_at_once(tmp_path: Path):
    a, b = _copy_task(tmp_path, "hello-file"), _copy_task(tmp_path, "csv-report")
    (a / "instruction.md").unlink()
    (b / "task.toml").unlink()
    with pytest.raises(TaskDefinitionError) as info:
        load_folder(tmp_path)
    problems = "\n".join(info.value.problems)
    assert "hello-file: missing instruction.md" in problems
    assert "csv-report: missing task.toml" in problems


def test_a_folder_without_tasks_is_a_source_error(tmp_path: Path):
    with pytest.raises(TaskSourceError, match="no task directories"):
        load_folder(tmp_path)


def test_a_missing_path_is_not_found():
    with pytest.raises(TaskNotFoundError):
        load_task("/nonexistent/task")


def test_selection_by_count_takes_the_first_tasks_in_name_order():
    assert [t.name for t in load_tasks("bundled", count=2)] == [t.name for t in bundled_tasks()[:2]]


def test_selection_by_indices_keeps_the_order_asked_for():
    tasks = bundled_tasks()
    assert select_tasks(tasks, indices=[2, 0, -1]) == [tasks[2], tasks[0], tasks[-1]]


def test_selection_by_short_or_full_name():
    picked = load_tasks("bundled", names=["csv-report", "harness/hello-file"])
    assert [t.name for t in picked] == ["csv-report", "hello-file"]


def test_unknown_names_are_listed_with_what_is_available():
    with pytest.raises(TaskSelectionError, match=r"\['nope'\].*available: .*hello-file"):
        load_tasks("bundled", names=["hello-file", "nope"])


@pytest.mark.parametrize(
    "selection",
    [{"count": 99}, {"indices": [0, 99]}, {"count": 1, "names": ["hello-file"]}],
)
def test_selections_that_do_not_fit_are_refused(selection: dict):
    with pytest.raises(TaskSelectionError):
        load_tasks("bundled", **selection)


def test_a_local_registry_dataset_loads_through_harbors_registry_client(tmp_path: Path):
    names = ["hello-file", "edit-json-config"]
    registry = tmp_path / "registry.json"
    registry.write_text(
        json.dumps(
            [
                {
                    "name": "harness-mini",
                    "version": "1.0",
                    "description": "two bundled tasks",
                    "tasks": [{"name": n, "path": str(BUNDLED_DIR / n)} for n in names],
                }
            ]
        )
    )
    tasks = load_registry("harness-mini@1.0", registry_path=registry)
    assert [t.name for t in tasks] == names
    assert all(t.source == "registry:harness-mini@1.0" for t in tasks)


def test_an_unknown_dataset_in_a_registry_is_a_source_error(tmp_path: Path):
    registry = tmp_path / "registry.json"
    registry.write_text("[]")
    with pytest.raises(TaskSourceError, match="could not provide dataset"):
        load_registry("missing@1.0", registry_path=registry)


def test_the_default_registry_offline_fails_fast_naming_the_offline_fix(monkeypatch):
    # Offline by force, not by the machine: every lookup and connection is refused (and seen).
    attempts = block_network(monkeypatch)
    with pytest.raises(TaskSourceUnavailableError, match="harbor datasets download"):
        load_source("registry:terminal-bench@2.0")
    assert attempts, "the registry was never asked: the error is not the offline one"


def test_an_hf_dataset_repo_offline_fails_naming_the_offline_fix(monkeypatch, tmp_path):
    attempts = block_network(monkeypatch)
    with pytest.raises(TaskSourceUnavailableError, match="hf download --repo-type dataset"):
        # an empty cache: nothing to fall back on
        load_source("hf:harness-test/no-such-tasks@main:tasks", cache_dir=tmp_path / "hf")
    assert attempts, "the hub was never asked: the error is not the offline one"


def test_an_hf_dataset_repo_in_the_local_cache_loads_its_tasks(tmp_path: Path):
    # Lay out huggingface_hub's cache exactly as a download would, then load with no network.
    repo = tmp_path / "datasets--org--tasks"
    commit = "0" * 40
    snapshot = repo / "snapshots" / commit
    shutil.copytree(BUNDLED_DIR / "hello-file", snapshot / "tasks" / "hello-file")
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    tasks = load_hf("org/tasks", subdir="tasks", cache_dir=tmp_path, offline=True)
    assert [t.name for t in tasks] == ["hello-file"] and tasks[0].source == "hf:org/tasks"


def test_an_unknown_source_form_names_the_forms_that_exist():
    with pytest.raises(TaskNotFoundError, match="registry:NAME@VERSION"):
        load_source("./no/such/folder")


def test_the_tasks_package_exports_exactly_its_public_names():
    import types

    import harness.tasks as package

    # Submodules appear as attributes once anything imported them (which depends on what ran
    # before this test), so they are told apart by type, not listed.
    submodules = {n for n in dir(package) if isinstance(getattr(package, n), types.ModuleType)}
    assert {"errors", "loader", "select", "sources"} <= submodules
    public = {n for n in dir(package) if not n.startswith("_")} - submodules
    assert set(package.__all__) == public
