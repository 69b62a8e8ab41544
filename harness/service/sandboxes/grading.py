"""Grading out of the agent's reach on any POSIX Harbor backend, through `exec` and file upload.

The local sandbox does this in its supervisor (`BwrapSandbox.prepare_grading`: the sandbox's
pid 1 kills its whole pid namespace). Harbor's other backends (docker, e2b, modal, daytona) give
us `exec` into the running environment and an upload of files, and some of them run their own
daemon inside it (the exec channel itself), which a blanket `kill -9 -1` would take down. So:

    after start:     `process_baseline(env)`: uploads the reset helper (reset_helper.c, compiled
                     here with `gcc -static`: system calls only, nothing from the image) to a
                     fresh path, and notes with it every process alive before the agent ran, each
                     as pid:starttime (the start time makes a recycled pid a different process),
                     and each grader hook file (local.GRADING_HOOKS: pytest's config and
                     conftest.py at /) with its checksum
    before grading:  `reset_for_grading(env, baseline)`: uploads the helper again over the same
                     path (fresh bytes, whatever the agent wrote there) and runs it: SIGKILL every
                     process not in the baseline until none is left, put /dev's links (fd, stdin,
                     stdout, stderr) and basic nodes back, make /, /logs, /run real dirs and
                     /tests, /logs/verifier and the grader's HOME fresh empty real dirs, and remove
                     each hook file that differs from the baseline; report what was found, like
                     the local sandbox's `GradingReset`. The Harness session then runs the
                     verifier with local.GRADING_ENV (a fresh HOME, no user site, no git hooks).
                     The helper also makes the grader Python's dir (GRADER_PYTHON_DIR, first on
                     GRADING_ENV's PYTHONPATH) a fresh empty real dir, and grader_site.py is then
                     uploaded there as its sitecustomize.py through the backend's file API: the
                     work dir never shadows a module the grader's Python has elsewhere, as in the
                     local sandbox, and nothing the agent planted in that dir is imported

The reset trusts no binary of the image (its rm, kill, chmod, stat and libc may all be the
agent's): only the backend's exec channel, which starts the helper through the image's `sh`, and
at the baseline (before the agent ran) the image's `chmod`. What it guarantees is what the exec
user may do: as root in a container (the usual Harbor image), every process the agent started and
every file it left is within reach. What it cannot cover: a shell the agent replaced (the
backend's exec runs through it: the helper's own output could be forged), a process that entered
another pid namespace the exec user cannot see into, one that rewrites the helper between its
upload and its start, processes outside the environment (a docker-compose sidecar), an exec user
without the rights the agent had, another CPU architecture than this host's (the helper is built
here), or a Windows environment (refused: there is no /proc). Nor the image itself: the agent is
root over it there, so it can change the grader's interpreter, pytest or site-packages in place;
only Harbor's separate-verifier mode (a fresh environment) covers that.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path
from typing import Any

from harness.service.sandboxes.errors import SandboxExecError, SandboxUnavailableError
from harness.service.sandboxes.local import (
    GRADER_PYTHON_DIR,
    GRADING_HOOKS,
    GRADING_PATHS,
    GradingReset,
)

__all__ = ["compiled_reset_helper", "process_baseline", "reset_for_grading"]

HELPER_SOURCE = Path(__file__).with_name("reset_helper.c")
GRADER_SITE = Path(__file__).with_name("grader_site.py")  # uploaded as its sitecustomize.py
_HELPER_ENTRY = "helper:"  # the baseline entry naming where the helper was uploaded


def _private_dir(path: Path) -> Path:
    """A cache dir only this user can write: a helper planted by another user is never run."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise SandboxUnavailableError(
            f"{path} (the reset helper's cache) is not owned by this user or is writable by "
            f"others (mode {info.st_mode & 0o777:o}): remove it, or set HARNESS_CACHE elsewhere"
        )
    return path


def compiled_reset_helper() -> Path:
    """reset_helper.c as a static binary for this host's architecture, built once per source."""
    from launchers.paths import cache_dir

    source = HELPER_SOURCE.read_bytes()
    key = hashlib.sha256(source).hexdigest()[:16]
    root = _private_dir(cache_dir() / "reset-helper")
    target = root / f"reset-helper-{platform.machine()}-{key}"
    if target.is_file():
        return target
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise SandboxUnavailableError(
            "the exec-only grading reset needs a C compiler with a static libc to build its "
            "helper: apt-get install gcc libc6-dev (./setup.sh installs them)"
        )
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        out = Path(tmp) / "reset-helper"
        built = subprocess.run(
            [cc, "-static", "-Os", "-s", "-o", str(out), str(HELPER_SOURCE)],
            capture_output=True,
            text=True,
            check=False,
        )
        if built.returncode != 0:
            raise SandboxUnavailableError(
                f"building the grading reset helper failed ({cc} -static): "
                f"{built.stderr[-800:]}\nA static libc is needed: apt-get install libc6-dev"
            )
        out.chmod(0o755)
        os.replace(out, target)
    return target


async def _run(env: Any, command: str, what: str) -> str:
    if str(getattr(env, "os", "linux")).lower().endswith("windows"):
        raise SandboxExecError(f"{what}: not available for a Windows environment (no /proc)")
    result = await env.exec(command, timeout_sec=120)
    if result.return_code != 0:
        raise SandboxExecError(
            f"{what} failed in the environment (exit {result.return_code}): "
            f"{(result.stderr or result.stdout or '')[-500:]}"
        )
    return result.stdout or ""


async def process_baseline(env: Any) -> list[str]:
    """The environment's own processes (pid:starttime) and hook files, taken before the agent
    runs; its first entry names where the reset helper was uploaded."""
    if str(getattr(env, "os", "linux")).lower().endswith("windows"):
        raise SandboxExecError("the process baseline: not available for a Windows environment")
    helper = f"/.harness-reset-{uuid.uuid4().hex}"
    await env.upload_file(compiled_reset_helper(), helper)
    # The image's chmod is trusted here only: the agent has not run yet.
    out = await _run(
        env,
        f"chmod 700 {helper} && {helper} baseline {shlex.join(GRADING_HOOKS)}",
        "the process baseline",
    )
    return [_HELPER_ENTRY + helper] + [line for line in out.split() if ":" in line]


async def reset_for_grading(
    env: Any, baseline: list[str], *, grader_python_dir: str = GRADER_PYTHON_DIR
) -> GradingReset:
    """Kill what the agent started, put /dev back, make the grading dirs fresh, upload the
    grader Python's sitecustomize.py (grader_site.py) to `grader_python_dir` (GRADING_ENV's
    PYTHONPATH names the default); what was found.

    An environment with `mounts_grader_python_dir = True` (the local sandbox, standing in for an
    exec-only backend in tests) has that dir as a read-only mount of its own: it is left alone.
    Tests of the upload over the local sandbox pass another `grader_python_dir`."""
    mounted = getattr(env, "mounts_grader_python_dir", False) is True
    helper = next((e[len(_HELPER_ENTRY) :] for e in baseline if e.startswith(_HELPER_ENTRY)), None)
    if helper is None:
        raise SandboxExecError("the grading reset needs a baseline from process_baseline()")
    keep = [e for e in baseline if not e.startswith(_HELPER_ENTRY)]
    found: list[str] = []
    # The shell's own test builtins: did the agent touch the helper's path? (no image binary)
    intact = await env.exec(
        f"[ -f {helper} ] && [ ! -L {helper} ] && [ -x {helper} ]", timeout_sec=60
    )
    if intact.return_code != 0:
        found.append(f"{helper} (the grading reset helper) was removed or changed")
        await env.exec(f"rm -rf {helper}", timeout_sec=60)  # it was the agent's: gone
    # Fresh bytes over whatever is there; an existing file keeps its mode, a new one needs chmod
    # (then the image's: the evidence above already makes this rollout `tampered`).
    await env.upload_file(compiled_reset_helper(), helper)
    # The grader Python's dir last (its parent /run is made a real dir first): fresh and empty,
    # so a module the agent planted there (first on the grader's sys.path) is gone.
    dirs = [*GRADING_PATHS] + ([] if mounted else [(grader_python_dir, 0o755, True)])
    paths = [str(x) for path, mode, wipe in dirs for x in (path, f"{mode:o}", int(wipe))]
    command = shlex.join(
        [helper, "reset", "--keep", *keep, "--hooks", *GRADING_HOOKS, "--paths", *paths]
    )
    if intact.return_code != 0:
        command = f"chmod 700 {helper} && {command}"
    out = await _run(env, command, "the grading reset")
    killed, survivors, errors = 0, [], []
    free_bytes = free_inodes = -1
    for line in out.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "killed":
            killed = int(rest)
        elif kind == "survivor":
            survivors.append(rest)
        elif kind == "found" and not _own_upload(rest, grader_python_dir):
            found.append(rest)
        elif kind == "error":
            errors.append(rest)
        elif kind == "free":
            blocks, size, inodes = (int(x) for x in rest.split())
            free_bytes, free_inodes = blocks * size, inodes
    # Fresh bytes into the dir the helper just made (no process of the agent's is left to race)
    if not mounted:
        await env.upload_file(GRADER_SITE, f"{grader_python_dir}/sitecustomize.py")
    return GradingReset(killed, survivors, found, errors, free_bytes, free_inodes)


def _own_upload(found: str, grader_python_dir: str) -> bool:
    """The helper found only what the last grading left in the grader Python's dir: its upload
    and the bytecode the grader's Python wrote of it. Not evidence (and wiped all the same)."""
    head = f"{grader_python_dir} held "
    if not found.startswith(head):
        return False
    count, _, names = found[len(head) :].partition(" entries: ")
    listed = names.split(", ")
    return count == str(len(listed)) and set(listed) <= {"sitecustomize.py", "__pycache__"}
