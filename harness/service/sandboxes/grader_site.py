"""The grader's Python imports its own modules, never the work dir's copies of them.

Installed as `sitecustomize.py` in a read-only dir (/run/harness-grader-python in the local
sandbox, built by supervisor_build.py) that the verifier's test command gets first on its
PYTHONPATH (local.GRADING_ENV). Runs inside the sandbox under whatever Python the grader uses,
so: the standard library only, Python >= 3.8 syntax.

The hole (issue 29, finding 2): a grader that runs `python3 -`, `python3 -c` or `python -m
pytest` from the agent's work dir has that dir first on sys.path, so an /app/configparser.py
(or re.py, json.py, pytest.py) planted by the agent runs in the grader and writes its reward.
PYTHONSAFEPATH would drop the dir altogether, and that broke graders that import the agent's
own module from there (`from solution import f`): that module is the answer being graded.

So the rule is by name, not by dir: a top-level module that the interpreter can find outside
the work dir (the standard library, site-packages, the grader's own dirs) is loaded from there;
only a name found nowhere else is looked up in the work dir, as before. The work dir here is the
current dir (and '' on sys.path), and $HARNESS_GRADER_WORKDIR (the task's workdir) and its
subdirs. Modules the interpreter imported before this file ran (encodings, os, site, ...) were
never searched in the work dir: sys.path gets the current dir only after site ran.

What it does not cover: a grader run with -I, -S or -E (no site, or PYTHONPATH ignored; -I also
never puts the work dir on the path), a task that sets PYTHONPATH itself (its own choice wins),
and a grader that imports the agent's module by a name nothing else provides (that is grading
the answer).
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _real(path):
    try:
        return os.path.realpath(path or ".")
    except (OSError, ValueError):
        return None


def _untrusted_roots():
    roots = []
    try:  # noqa: SIM105 (contextlib: an import the grader's start-up does not need)
        roots.append(_real(os.getcwd()))
    except OSError:
        pass
    workdir = os.environ.get("HARNESS_GRADER_WORKDIR")
    if workdir:
        roots.append(_real(workdir))
    return [r for r in roots if r]


def _untrusted(entry, roots):
    if entry in ("", "."):
        return True
    real = _real(entry)
    if real is None:
        return True
    # (a work dir of / is the dir itself, not everything under it)
    return any(real == root or (root != "/" and real.startswith(root + "/")) for root in roots)


class _TrustedFirst:
    """A meta-path finder ahead of the default ones, for top-level names only."""

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if path is not None or "." in name:
            return None  # a submodule: its package's __path__ decides, as usual
        roots = _untrusted_roots()
        entries = [e for e in sys.path if isinstance(e, str)]
        if not any(_untrusted(e, roots) for e in entries):
            return None
        trusted = [e for e in entries if not _untrusted(e, roots) and e != _HERE]
        return importlib.machinery.PathFinder.find_spec(name, trusted, target)

    @classmethod
    def invalidate_caches(cls):
        pass


def _chain_next_sitecustomize():
    """Run the sitecustomize we shadowed (Debian ships one in the standard library's dir)."""
    for entry in sys.path:
        if not isinstance(entry, str) or _real(entry) == _HERE:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if entry not in ("", ".") and os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_harness_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                module = importlib.util.module_from_spec(spec)
                try:  # noqa: SIM105 - as site.py does: a broken hook must not stop the grader
                    spec.loader.exec_module(module)
                except Exception:  # noqa: BLE001
                    pass
            return


if not any(f is _TrustedFirst for f in sys.meta_path):
    sys.meta_path.insert(0, _TrustedFirst)
    _chain_next_sitecustomize()
