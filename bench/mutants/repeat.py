"""Does a test fail on a mutant every time, not just once? Run it N times on one mutated copy.

    .venv/bin/python bench/mutants/repeat.py MUTANT [TEST ...] [--runs 10] [--timeout S]

An attack test whose verdict depends on a race (the attack acting before the grader reads)
can catch a mutant in one run and miss it in the next: issue 37 saw the setsid-daemon test pass
with the grading reset removed when its file ran whole. `run.py` runs each mutant once; this
copies the repository once (as run.py does), applies the named mutant from run.py's list, and
runs the tests (the mutant's own unless TEST ids are given) `--runs` times, each in a fresh
pytest process. Prints one line a run and `failed K/N`; exit status 0 only if every run failed
(the defence is needed every time), 1 if some run passed, 2 if the mutant could not be applied
or a run ended other than pass/fail (a timeout, a collection error).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path


def _load_runner():
    spec = importlib.util.spec_from_file_location("mutants_run", Path(__file__).with_name("run.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


RUN = _load_runner()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mutant", help="a mutant's name (run.py --list shows them)")
    parser.add_argument("tests", nargs="*", help="pytest node ids (default: the mutant's own)")
    parser.add_argument("--runs", type=int, default=10, help="how many runs (default 10)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds one run may take (default 300)")
    args = parser.parse_args(argv)
    by_name = {m.name: m for m in RUN.MUTANTS}
    if args.mutant not in by_name:
        parser.error(f"no mutant named {args.mutant!r}; run.py --list shows them")
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: give at least 1")
    mutant = by_name[args.mutant]
    tests = args.tests or list(mutant.tests)

    with tempfile.TemporaryDirectory(prefix=f"repeat-{mutant.name}-") as tmp:
        tree = Path(tmp) / "repo"
        RUN.make_copy(RUN.REPO_ROOT, RUN.source_files(RUN.REPO_ROOT), tree)
        RUN.check_imports_from(tree)
        why = RUN.apply(mutant, tree)
        if why is not None:
            print(f"{mutant.name}: broken: {why}", file=sys.stderr)
            return 2
        failed, odd = 0, 0
        for run in range(1, args.runs + 1):
            start = time.monotonic()
            rc, output = RUN.run_pytest(tree, tests, args.timeout)
            node, line = RUN.first_failure(output)
            verdict = {0: "passed", 1: "failed"}.get(rc, "timeout" if rc is None else f"rc {rc}")
            failed += verdict == "failed"
            odd += verdict not in ("passed", "failed")
            print(f"run {run}: {verdict} in {time.monotonic() - start:.1f} s"
                  + (f" ({node}: {line})" if verdict != "passed" and node else ""), flush=True)
    print(f"{mutant.name}: failed {failed}/{args.runs} runs of {' '.join(tests)}")
    if odd:
        return 2
    return 0 if failed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
