"""Mutation check over the core invariants: does each test that claims a property fail without it?

    .venv/bin/python bench/mutants/run.py [--only NAME ...] [--json PATH] [--timeout S]
                                          [--skip-baseline] [--list]

Each mutant below is one plausible bug in a property the trainer or the grader rests on (the
rollout graph's parents, loss masks, advantages, loss weights, staleness, the TIS cap, the
grading reset, the capture's prompt-id parsing): a file, the exact text to replace (it must
occur there exactly once, or the mutant is "broken": the list has rotted), its replacement, and
the tests that must catch it. For each mutant the repository's files (`git ls-files`: tracked,
plus untracked ones git does not ignore, as they are in the work tree) are copied to a fresh temp
dir, the one replacement is applied, and the named tests run there (`pytest -x -q -p
no:cacheprovider`, the copy first on PYTHONPATH, no bytecode written) under a timeout:

    caught    the tests failed (the first failing test and its failure line are reported)
    survived  the tests passed: they do not guard the property they claim to
    broken    the old text is not in the file exactly once (fix the list, not the code)
    error     pytest could not run them (a node id that no longer exists, a collection error)
    timeout   they ran past --timeout (a hang is a detection, but the list wants fast tests)

First, unless --skip-baseline, every named test runs once on the unmutated copy: a test that
fails there would "catch" every mutant. The ignored venv and tool links at the repo's top
(.venv, .engine-venv, .mswea-venv, .tools) are linked into each copy so that tests find them.
Prints a table; `--json` writes the same as JSON. Exit status: 0 every mutant caught, 1 some
mutant survived, 2 otherwise not clean (broken, error, timeout, or the baseline failed).
tests/test_mutants_list.py checks, without running anything, that every old text is still in
its file exactly once and every named test still exists.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Ignored at the repo's top but needed by some tests (launchers/paths.py resolves them there).
LINKED = (".venv", ".engine-venv", ".mswea-venv", ".tools", ".trainer-venv")
PYTEST_FLAGS = ("-x", "-q", "-p", "no:cacheprovider")


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repo root
    old: str  # must occur in `file` exactly once
    new: str
    tests: tuple[str, ...]  # pytest files or node ids that must fail on the mutant
    bug: str  # what the mutant breaks, in words


MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "graph_fast_path_trusts_hot_parent",
        "capture/graph.py",
        "        i = bisect.bisect_left(self._ends, (found.end, -1))\n",
        "        return False\n",
        ("tests/test_capture_graph.py",),
        "the hot-leaf fast path never double-checks a parent against other branches",
    ),
    Mutant(
        "staleness_from_end_version",
        "trainer/staleness.py",
        "versions = list(compress(row.version_start, row.loss_mask))",
        "versions = list(compress(row.version_end, row.loss_mask))",
        ("tests/test_trainer_maths.py",),
        "a turn's age counted from the version it ended on, not the one it started on",
    ),
    Mutant(
        "advantage_sign_flipped",
        "trainer/advantages.py",
        "(r - mean) / scale for r in rewards]",
        "(mean - r) / scale for r in rewards]",
        ("tests/test_trainer_maths.py",),
        "group advantages negated: the loop would learn to fail",
    ),
    Mutant(
        "prompt_tokens_trainable",
        "trainer/rows.py",
        "        self.loss_mask.extend([0] * n)\n",
        "        self.loss_mask.extend([1] * n)\n",
        ("tests/test_trainer_rows.py",),
        "a row's prompt (context) positions get loss mask 1",
    ),
    Mutant(
        "export_prompt_mask_ones",
        "capture/export.py",
        'zeros = memoryview(b"0," * longest)',
        'zeros = memoryview(b"1," * longest)',
        ("tests/test_capture_export.py",),
        "the exported trace's loss_mask marks prompt positions trainable",
    ),
    Mutant(
        "sequence_norm_gets_token_weights",
        "trainer/packing.py",
        '        if norm == "token":\n            return 1.0 / total_tokens\n',
        '        if norm in ("token", "sequence"):\n            return 1.0 / total_tokens\n',
        ("tests/test_trainer_maths.py", "tests/test_trainer_defects.py"),
        'loss_norm="sequence" silently weighted per token',
    ),
    Mutant(
        "tis_cap_removed",
        "trainer/loss.py",
        "trunc_ratio = torch.exp(lr.clamp(max=math.log(is_cap)) + (log_ratio - lr))",
        "trunc_ratio = torch.exp(lr + (log_ratio - lr))",
        ("tests/test_trainer_maths.py", "tests/test_trainer_numerics.py"),
        "the importance ratio is no longer truncated at is_cap (TIS)",
    ),
    Mutant(
        "is_cap_inside_clip_accepted",
        "trainer/config.py",
        "        if self.is_cap <= upper:\n",
        "        if False:\n",
        ("tests/test_trainer_defects.py",),
        "the config accepts an is_cap at or inside the clip range (the gradient leaks)",
    ),
    Mutant(
        "grading_reset_keeps_tests",
        "harness/service/sandboxes/grading_state.py",
        '    ("/tests", 0o755, True),\n',
        '    ("/tests", 0o755, False),\n',
        ("tests/test_sandbox_grading.py",),
        "the grading reset leaves the agent's /tests in place instead of a fresh empty dir",
    ),
    Mutant(
        "grading_reset_kills_nothing",
        "harness/service/sandboxes/supervisor.py",
        '    killed, survivors = _killall(float(header.get("timeout") or 10.0))\n',
        "    killed, survivors = 0, []\n",
        ("tests/test_sandbox_grading.py",),
        "the local sandbox's grading reset leaves the agent's processes running",
    ),
    Mutant(
        "harbor_trial_skips_grading_reset",
        "harness/service/sandboxes/bwrap.py",
        "        if self._agent_ran:\n            reset = await self.prepare_grading()\n",
        "        if False:\n            reset = await self.prepare_grading()\n",
        ("tests/test_sandbox_grading.py",),
        "Harbor's Trial on the local sandbox grades without the reset (the agent's daemons live)",
    ),
    Mutant(
        "exec_reset_helper_kills_nothing",
        "harness/service/sandboxes/reset_helper.c",
        "            if (kill((pid_t)procs[i].pid, SIGKILL) == 0) killed++;\n",
        "            if (0) killed++;\n",
        (
            "tests/test_sandbox_grading.py::"
            "test_the_exec_only_reset_ends_leftovers_and_resets_the_grading_dirs",
        ),
        "the exec-only backends' reset helper signals no process",
    ),
    Mutant(
        "grader_env_keeps_the_agents_home",
        "harness/service/sandboxes/grading_state.py",
        '    "HOME": GRADING_HOME,\n    "PYTHONPATH": GRADER_PYTHON_DIR,\n'
        '    "PYTHONNOUSERSITE": "1",\n',
        '    "PYTHONPATH": GRADER_PYTHON_DIR,\n',
        (
            "tests/test_sandbox_grading.py::"
            "test_harbor_trial_a_usercustomize_for_the_graders_python_earns_nothing",
        ),
        "the grader runs with the agent's HOME and user site (a usercustomize.py it left runs)",
    ),
    Mutant(
        "nested_prompt_ids_fallback_removed",
        "capture/upstream.py",
        '    if reply.get("prompt_token_ids", 0) is not None:\n',
        "    if False:\n",
        ("tests/test_capture_graph.py",),
        "a nested prompt_token_ids key cut out instead of the reply's top-level one is trusted",
    ),
)


@dataclass
class Result:
    name: str
    file: str
    tests: list[str]
    verdict: str  # caught | survived | broken | error | timeout
    caught_by: str | None  # the first failing test's node id
    failure: str | None  # its failure line (or why broken / error)
    seconds: float


def source_files(root: Path) -> list[str]:
    """The files a copy needs: tracked ones, and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         cwd=root, check=True, capture_output=True).stdout
    return sorted({name for name in out.decode().split("\0") if name})


def make_copy(root: Path, files: list[str], dest: Path) -> None:
    for name in files:
        src = root / name
        if not src.is_file() and not src.is_symlink():
            continue  # deleted in the work tree, not yet in git
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
    for name in LINKED:
        if (root / name).exists():
            (dest / name).symlink_to((root / name).resolve())


def apply(mutant: Mutant, tree: Path) -> str | None:
    """Apply the one replacement in `tree`; None if done, else why it could not be."""
    path = tree / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist: update the mutant list"
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        return (f"the old text occurs {count} times in {mutant.file} (must be exactly once): "
                "update the mutant list to the code")
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def test_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale .pyc can carry a mutant across copies
    env["COLUMNS"] = "1000"  # pytest cuts the summary's failure line to the terminal's width
    return env


def run_pytest(tree: Path, tests: list[str], timeout_s: float) -> tuple[int | None, str]:
    """(pytest's exit status or None on timeout, its output). Its process group dies with it."""
    cmd = [sys.executable, "-m", "pytest", *PYTEST_FLAGS, "--basetemp", str(tree.parent / "pt"),
           *tests]
    proc = subprocess.Popen(cmd, cwd=tree, env=test_env(tree), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        return proc.returncode, out.decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the tests' sandboxes go with it
        out, _ = proc.communicate()
        return None, out.decode(errors="replace")


_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$", re.MULTILINE)
_E_LINE = re.compile(r"^E +(\S.*)$", re.MULTILINE)  # the traceback's first error line


def first_failure(output: str) -> tuple[str | None, str | None]:
    """The first FAILED/ERROR line of pytest's short summary (-ra): node id, failure line."""
    match = _SUMMARY.search(output)
    if match is None:
        return None, None
    line = match.group(3)
    if not line:
        e_line = _E_LINE.search(output)
        line = e_line.group(1) if e_line else match.group(1)
    return match.group(2), line.strip()[:300]


def check_imports_from(tree: Path) -> None:
    """The copy, not an installed checkout, must be what the tests import (else: false survivors)."""
    probe = "import capture, harness, trainer; print(capture.__file__, harness.__file__, trainer.__file__)"
    out = subprocess.run([sys.executable, "-c", probe], cwd=tree, env=test_env(tree),
                         capture_output=True, text=True, check=True).stdout.split()
    outside = [f for f in out if not Path(f).resolve().is_relative_to(tree.resolve())]
    if outside:
        raise SystemExit(f"the copy's packages are shadowed ({outside} imported instead of the "
                         f"copy in {tree}): the mutants would not be tested")


def run_mutant(mutant: Mutant, files: list[str], timeout_s: float) -> Result:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        tree = Path(tmp) / "repo"
        make_copy(REPO_ROOT, files, tree)
        why = apply(mutant, tree)
        if why is not None:
            verdict, node, line = "broken", None, why
        else:
            rc, output = run_pytest(tree, list(mutant.tests), timeout_s)
            node, line = first_failure(output)
            if rc is None:
                verdict, line = "timeout", f"past {timeout_s:g} s"
            elif rc == 0:
                verdict = "survived"
            elif rc == 1:
                verdict = "caught"
            else:  # 2 interrupted, 3 internal error, 4 usage (no such test), 5 none collected
                verdict = "error"
                line = line or f"pytest exited {rc}: {output.strip().splitlines()[-1:]}"
    return Result(mutant.name, mutant.file, list(mutant.tests), verdict, node, line,
                  round(time.monotonic() - start, 1))


def baseline(mutants: list[Mutant], files: list[str], timeout_s: float) -> tuple[bool, str]:
    """Every named test on the unmutated copy: (all passed, what failed)."""
    tests = list(dict.fromkeys(t for m in mutants for t in m.tests))
    with tempfile.TemporaryDirectory(prefix="mutant-baseline-") as tmp:
        tree = Path(tmp) / "repo"
        make_copy(REPO_ROOT, files, tree)
        check_imports_from(tree)
        rc, output = run_pytest(tree, tests, timeout_s * len(mutants))
    if rc == 0:
        return True, ""
    node, line = first_failure(output)
    return False, f"{node}: {line}" if node else output[-2000:]


def print_table(results: list[Result], total_s: float) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    style = {"caught": "green", "survived": "bold red", "broken": "yellow", "error": "yellow",
             "timeout": "yellow"}
    caught = sum(r.verdict == "caught" for r in results)
    table = Table(title=f"Mutants: {caught} of {len(results)} caught ({total_s:.0f} s in all)")
    for column in ("mutant", "verdict", "caught by (first failing test)", "s"):
        table.add_column(column, justify="right" if column == "s" else "left")
    for r in results:
        shown = (r.caught_by or "").removeprefix("tests/") if r.verdict == "caught" else r.failure
        table.add_row(r.name, f"[{style[r.verdict]}]{r.verdict}[/]", escape(shown or ""),
                      f"{r.seconds:.1f}")
    # Piped to a file or a log, the table keeps its rows whole (the failure lines are in --json).
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these mutants")
    parser.add_argument("--json", type=Path, help="also write the results here as JSON")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one mutant's tests may run (default 300)")
    parser.add_argument("--skip-baseline", action="store_true",
                        help="do not first run the named tests on the unmutated code")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)

    mutants = list(MUTANTS)
    if args.only:
        unknown = sorted(set(args.only) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"no mutant named {unknown}; --list shows them")
        mutants = [m for m in MUTANTS if m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name:38} {m.file:36} {m.bug}")
        return 0

    start = time.monotonic()
    files = source_files(REPO_ROOT)
    if not args.skip_baseline:
        ok, what = baseline(mutants, files, args.timeout)
        if not ok:
            print(f"baseline failed (unmutated code): {what}\nEvery mutant would read as caught; "
                  "fix the tests first, or pass --skip-baseline to run anyway.", file=sys.stderr)
            return 2
        print(f"baseline: the named tests pass on the unmutated code "
              f"({time.monotonic() - start:.0f} s)", flush=True)
    results = []
    for m in mutants:
        r = run_mutant(m, files, args.timeout)
        print(f"{r.name}: {r.verdict} in {r.seconds:.1f} s"
              + (f" by {r.caught_by}" if r.caught_by else "")
              + (f" ({r.failure})" if r.failure and r.verdict != "caught" else ""), flush=True)
        results.append(r)
    total_s = round(time.monotonic() - start, 1)
    print_table(results, total_s)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                    cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip())
        args.json.write_text(json.dumps({
            "commit": commit, "dirty": dirty, "baseline": not args.skip_baseline,
            "total_s": total_s, "mutants": [asdict(r) for r in results],
        }, indent=2) + "\n")
    verdicts = {r.verdict for r in results}
    if "survived" in verdicts:
        return 1
    return 0 if verdicts <= {"caught"} else 2


if __name__ == "__main__":
    sys.exit(main())
