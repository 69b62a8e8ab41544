"""No test module imports another test module: shared helpers live in tests/helpers/.

Run: .venv/bin/python -m pytest tests/test_test_layout.py -q

A helper private to one test file (a tiny model, a scripted agent, a tool definition) changes for
that file's tests; when another file imports it, that change silently changes the other file's
tests too (issue 37 found test_trainer_defects, test_session_limits and a bench script reaching
into other tests' privates). Scanned with ast, so comments and docstrings that merely name a test
file do not count, while the scripts the tests write for torchrun ranks or killed processes
(string constants) do: an `import` line inside a string is an import in the process that runs it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The packages whose code could import a test module: the tests, their helpers, the scripts and
# the project itself (bench/view/real_run.py once imported the browser test's policy).
SCANNED = ("tests", "bench", "launchers", "harness", "capture", "trainer")
# A test module is `test_*.py`; imported as tests.test_x, or as test_x with tests/ on sys.path.
_TEST_MODULE = re.compile(r"^(tests\.)?test_\w+$")
# `from [tests.]test_x import ...` or `import [tests.]test_x` at the start of a script's line.
_IN_SCRIPT = re.compile(r"^\s*(from\s+(tests\.)?test_\w+\s+import|import\s+(tests\.)?test_\w+)",
                        re.M)


def test_module_imports(source: str) -> list[str]:
    """Every import of a test module in `source`, as `line N: module`, including those in string
    constants (scripts written out and run by the tests) and relative ones (`from .test_x`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: {a.name}" for a in node.names
                      if _TEST_MODULE.match(a.name)]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if _TEST_MODULE.match(module) or (node.level and module.startswith("test_")):
                found.append(f"line {node.lineno}: {'.' * node.level}{module}")
            elif node.level and not module:  # from . import test_x
                found += [f"line {node.lineno}: .{a.name}" for a in node.names
                          if a.name.startswith("test_")]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [f"line {node.lineno} (a script in a string): {m.group(0).strip()}"
                      for m in _IN_SCRIPT.finditer(node.value)]
    return found


# Named test_*, but a helper: pytest must not collect it as a test.
test_module_imports.__test__ = False  # type: ignore[attr-defined]


def python_files() -> list[Path]:
    files = []
    for top in SCANNED:
        files += [p for p in (REPO / top).rglob("*.py")
                  if "fixtures" not in p.relative_to(REPO).parts[:2] or top != "tests"]
    return sorted(files)


def test_no_module_imports_a_test_module() -> None:
    offenders = {}
    for path in python_files():
        if path == Path(__file__).resolve():
            continue  # its own examples of what the check must find
        found = test_module_imports(path.read_text())
        if found:
            offenders[str(path.relative_to(REPO))] = found
    assert not offenders, (
        "these import a test module; move what they share into tests/helpers/ "
        f"and import it from there: {offenders}")


def test_the_scan_reads_every_test_module_and_the_helpers() -> None:
    scanned = {p.relative_to(REPO).as_posix() for p in python_files()}
    assert "tests/test_trainer_step.py" in scanned and "tests/helpers/trainer.py" in scanned
    assert "bench/view/real_run.py" in scanned and "launchers/warm_models.py" in scanned


# Written with {t} standing for "tests.", so that issue 37's grep over the repo for imports of
# test modules finds none, these examples included.
@pytest.mark.parametrize("source", [s.format(t="tests.") for s in (
    "from {t}test_trainer_step import _trainer\n",
    "import {t}test_factory_causes\n",
    "import {t}test_factory_causes as causes\n",
    "from .test_dialects_memo import chat_turns\n",
    "from . import test_dialects_memo\n",
    "def f():\n    from test_trainer_step import _source\n",
    'SCRIPT = """\nimport sys\nfrom test_trainer_step import _seeded_tiny_model\n"""\n',
    "X = 'import {t}test_view_browser'\n",
)], ids=["from-tests", "import-tests", "import-as", "relative-from", "relative-import",
         "tests-dir-on-path", "script-string", "one-line-string"])
def test_the_check_finds_each_way_a_test_module_is_imported(source: str) -> None:
    assert len(test_module_imports(source)) == 1, source


@pytest.mark.parametrize("source", [
    "from tests.helpers.trainer import seeded_tiny_model\n",
    "import tests.helpers.waiting\n",
    "from harness.audit.scripted_engine import ScriptedEngine\n",
    '"""Checked by tests/test_trainer_step.py (from test_trainer_step import nothing)."""\n',
    "from trainer.test_utils import x\n",
], ids=["helper", "helper-module", "scripted-engine", "docstring-mention", "not-a-test-package"])
def test_helpers_and_mentions_of_test_files_are_not_imports(source: str) -> None:
    assert test_module_imports(source) == [], source
