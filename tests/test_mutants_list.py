"""The mutation check's list (bench/mutants/run.py) stays true to the code, without running it.

    .venv/bin/python -m pytest tests/test_mutants_list.py -q

Each mutant names a file, an exact text that must occur there once, and the tests that must
catch the change. When the code or a test moves, this fails here, in the ordinary suite, instead
of the mutation run reporting "broken" or "error" weeks later.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load_runner():
    spec = importlib.util.spec_from_file_location("mutants_run", REPO_ROOT / "bench/mutants/run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


RUNNER = _load_runner()
MUTANTS = RUNNER.MUTANTS


def test_mutant_names_are_unique_and_the_list_covers_the_core_invariants():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), names
    files = {m.file for m in MUTANTS}
    for core in ("capture/graph.py", "trainer/staleness.py", "trainer/advantages.py",
                 "trainer/rows.py", "trainer/packing.py", "trainer/loss.py",
                 "capture/upstream.py", "harness/service/sandboxes/supervisor.py"):
        assert core in files, f"no mutant over {core}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutants_old_text_occurs_exactly_once_in_its_file(mutant):
    text = (REPO_ROOT / mutant.file).read_text()
    assert mutant.old != mutant.new
    assert text.count(mutant.old) == 1, (
        f"{mutant.name}: its old text occurs {text.count(mutant.old)} times in {mutant.file}; "
        "update bench/mutants/run.py's MUTANTS to the code"
    )


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_each_mutants_tests_exist(mutant):
    assert mutant.tests, f"{mutant.name} names no test"
    for target in mutant.tests:
        path, _, node = target.partition("::")
        source = REPO_ROOT / path
        assert source.is_file(), f"{mutant.name}: {path} does not exist"
        if node:  # a test function (a parametrised one may carry [id]): defined in that file
            name = node.split("::")[-1].split("[")[0]
            assert re.search(rf"^(async )?def {re.escape(name)}\(", source.read_text(),
                             re.MULTILINE), f"{mutant.name}: no test {name} in {path}"


def test_apply_refuses_an_old_text_that_is_not_there_exactly_once(tmp_path):
    # The runner's own guard: a rotted mutant is "broken", never silently a no-op that "survives".
    (tmp_path / "f.py").write_text("x = 1\nx = 1\n")
    twice = RUNNER.Mutant("twice", "f.py", "x = 1\n", "x = 2\n", ("t.py",), "")
    missing = RUNNER.Mutant("missing", "f.py", "y = 1\n", "y = 2\n", ("t.py",), "")
    assert "occurs 2 times" in RUNNER.apply(twice, tmp_path)
    assert "occurs 0 times" in RUNNER.apply(missing, tmp_path)
    assert (tmp_path / "f.py").read_text() == "x = 1\nx = 1\n"
    (tmp_path / "g.py").write_text("a = 1\n")
    once = RUNNER.Mutant("once", "g.py", "a = 1", "a = 2", ("t.py",), "")
    assert RUNNER.apply(once, tmp_path) is None
    assert (tmp_path / "g.py").read_text() == "a = 2\n"


def test_the_first_failing_test_and_its_line_are_read_from_pytests_summary():
    output = (
        "E       assert [0, 1] == [0, 0]\n"
        "=========================== short test summary info ============================\n"
        "FAILED tests/test_x.py::test_y[3]\n"
        "!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    )
    assert RUNNER.first_failure(output) == ("tests/test_x.py::test_y[3]", "assert [0, 1] == [0, 0]")
    assert RUNNER.first_failure("FAILED tests/a.py::b - ValueError: no\n") == (
        "tests/a.py::b", "ValueError: no")
    assert RUNNER.first_failure("3 passed in 0.1s\n") == (None, None)
