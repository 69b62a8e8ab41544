"""The project's import plan, read from the source: no circles, and the trainer side never
reaches the service side.

Static checks over every `import` in capture/, harness/, trainer/ and launchers/ (parsed, not
run, so a lazy import inside a function counts too):

1. No import circle among the project's modules, type-only imports (`if TYPE_CHECKING:`)
   included. A circle (`capture.app -> agent_routes -> app`, `harness.eval -> preflight ->
   learning -> eval`, ...) means neither module can be read, tested or moved without the other;
   the fix is a third module both import (capture.state, harness.shared.tables' pass-rate
   table, harness.service.proxy_link).
2. The import contract. The trainer's process runs trainer/, `harness.train` and
   `harness.client.remote` and whatever those can import, at module level or lazily (their
   closure, computed here). None of those modules may import the service side (SERVICE: harbor, openenv, capture,
   the rollout service's folder harness/service/, the task loaders harness/tasks/, and the
   commands whose own process runs rollouts: serve, eval, audit), not even lazily: vLLM's
   environment has no harbor, and a lazy import is one call away from running. The one kind
   of import left out is a type name under `if TYPE_CHECKING:`, which never runs. No
   exceptions are listed: code that both sides need lives in harness/shared/, code that only
   a rollout process runs lives on the service side, and the trainer's process reaches it only
   by starting that process (`python -m harness.serve`, `python -m harness.service.preflight`).
3. The arrows between the top folders point one way: trainer/ imports no harness or capture, and
   launchers/ (processes, committed models) imports no harness.

tests/test_trainer_isolation.py checks the same boundary at run time (what the real
`python -m harness.train` loads) and that trainer/ imports no harness at all.

Run: .venv/bin/python -m pytest tests/test_import_graph.py -q   (under a second)
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path
from typing import NamedTuple

from launchers.paths import REPO_ROOT

PACKAGES = ("capture", "harness", "trainer", "launchers")

# The rollout service's side: what only a process that runs rollouts may import. That is
# `python -m harness.serve` and the commands that run rollouts in their own process: harness.eval
# (its session factory and capture proxy in-process), harness.audit, and the child
# `python -m harness.service.preflight` that checks tasks and sandboxes for harness.train.
SERVICE = ("harbor", "openenv", "capture", "harness.service", "harness.tasks", "harness.serve",
           "harness.eval", "harness.audit")

# The trainer's process: these, and their module-level closure.
TRAINER_ROOTS = ("trainer", "harness.train", "harness.client.remote")


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")


@cache
def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO_ROOT / pkg).rglob("*.py"))
            if "bundled" not in p.parts}  # task fixtures run inside sandboxes, not here


def _owner(name: str) -> str | None:
    """The project module an imported name loads (`harness.tasks.load_tasks` -> harness.tasks)."""
    modules = project_modules()
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_type_checking(node: ast.AST) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


class Import(NamedTuple):
    target: str  # the dotted name imported, relative imports resolved
    at_top: bool  # runs when the module is imported (not inside a function or class body)
    type_only: bool  # under `if TYPE_CHECKING:`: a name for annotations, never imported


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    """Every import in `module`, relative ones resolved.

    Module level is the module's own statements and those under a top-level `if`/`try`; anything
    in a function or class body is lazy. The body of an `if TYPE_CHECKING:` is type-only."""
    path = project_modules()[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    top: set[int] = set()
    for stmt in tree.body:
        top.add(id(stmt))
        if isinstance(stmt, ast.If | ast.Try):
            top.update(id(n) for n in ast.walk(stmt))
    type_only = {id(n) for node in ast.walk(tree) if _is_type_checking(node)
                 for stmt in node.body for n in ast.walk(stmt)}
    found: list[Import] = []
    for node in ast.walk(tree):
        flags = (id(node) in top, id(node) in type_only)
        if isinstance(node, ast.Import):
            found += [Import(a.name, *flags) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                if path.name != "__init__.py":
                    parts = parts[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append(Import(sub if sub in project_modules() else base, *flags))
    return tuple(found)


def project_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module in project_modules():
        targets = {_owner(i.target) for i in imports_of(module)}  # type-only ones too
        edges[module] = {t for t in targets if t and t != module}
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def trainer_side() -> set[str]:
    """TRAINER_ROOTS and every project module they can load, at module level or lazily (with
    its packages' __init__ modules, which Python runs first); a type-only import loads nothing."""
    modules = project_modules()
    todo = [m for m in modules if any(m == r or m.startswith(r + ".") for r in TRAINER_ROOTS)]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules]
        todo += [o for i in imports_of(module) if not i.type_only and (o := _owner(i.target))]
    return seen


def _is_service(name: str) -> bool:
    return any(name == s or name.startswith(s + ".") for s in SERVICE)


def crossings() -> set[tuple[str, str]]:
    """(trainer-side module, service-side name) for every import that can run, lazy ones too."""
    return {(m, i.target) for m in trainer_side() for i in imports_of(m)
            if not i.type_only and _is_service(i.target)}


def test_the_checks_read_every_package() -> None:
    # the checks below are vacuous over a tree they do not see: each package is read, whole
    modules = project_modules()
    for package in PACKAGES:
        assert sum(m.split(".")[0] == package for m in modules) >= 5, package
    assert {"launchers.engine", "harness.train", "harness.service.factory", "capture.app",
            "trainer.grpo"} <= set(modules)
    assert len(project_edges()["harness.train"]) >= 5  # and its imports are parsed


def test_no_import_circles_among_the_projects_modules() -> None:
    assert circles(project_edges()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    # the check above is only as good as this: a planted circle, a lazy edge included
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_trainer_side_is_trainer_the_train_command_and_the_service_client() -> None:
    side = trainer_side()
    assert {"harness.train", "harness.client.remote", "trainer.grpo",
            "harness.shared.run_config"} <= side
    # the service's own modules are not on it, not even through a package's __init__
    assert not {m for m in side if _is_service(m)}


def test_the_trainer_side_never_imports_the_service_side() -> None:
    # Not even lazily. The fix for a finding is never an exception here: move what both sides
    # need to harness/shared/, or what only rollouts need to the service side.
    assert crossings() == set(), "a trainer-side module imports the service side"


def test_the_checks_see_lazy_imports_and_leave_out_only_type_only_ones(tmp_path: Path,
                                                                      monkeypatch) -> None:
    # what the two checks above are only as good as: a planted module with each kind of import
    source = (
        "from typing import TYPE_CHECKING\n"
        "import harness.shared.errors\n"
        "if TYPE_CHECKING:\n"
        "    from openenv.core import Thing\n"
        "else:\n"
        "    import yaml\n"
        "def later():\n"
        "    from harbor.models import Task\n"
    )
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    monkeypatch.setitem(project_modules(), "harness.planted", planted)
    imports_of.cache_clear()
    try:
        found = {i.target: (i.at_top, i.type_only) for i in imports_of("harness.planted")}
    finally:
        imports_of.cache_clear()
    assert found == {"typing": (True, False), "harness.shared.errors": (True, False),
                     "openenv.core": (True, True), "yaml": (True, False),
                     "harbor.models": (False, False)}


def test_trainer_imports_no_harness_or_capture_module_at_all() -> None:
    offenders = {(m, t) for m in project_modules() if m.startswith("trainer")
                 for t, *_ in imports_of(m) if t.split(".")[0] in ("harness", "capture")}
    assert offenders == set()


def test_no_launcher_imports_harness() -> None:
    # launchers/ starts processes and knows nothing of rollouts: harness may import it, never the
    # reverse, not even lazily (issue 33; the warm-start builders, which run rollouts, live in
    # harness/warm/, and launchers/warm_models.py holds only the committed folders' checks).
    offenders = {(m, t) for m in project_modules() if m.startswith("launchers")
                 for t, *_ in imports_of(m) if t.split(".")[0] == "harness"}
    assert offenders == set()
