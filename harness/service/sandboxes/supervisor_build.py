"""The code bound read-only into every local sandbox, built once per host user and checked at reuse.

Two dirs, each bound read-only into the sandbox:

    supervisor    supervisor.py, pid1_commands.py, pid1_events.py, pid1_setup.py, relays.py,
                  grading_reset.py, grading_scratch.py, grading_strict.py and their bytecode,
                  for pid 1 (/run/harness-supervisor): it runs every command and reports
                  every exit code, the verifier's included
    grader-python sitecustomize.py for the grader's Python (/run/harness-grader-python, see
                  grader_site.py): what keeps the work dir from shadowing its modules

Why the checks (issue 29, finding 5): the build used to be reused from a shared path
(/dev/shm/harness-sandboxes, or $TMPDIR) if a `.complete` marker was there, so another local
user could plant a pid 1 that forges every result, the reward included. Now the cache lives in a
dir of our own uid, mode 0700, under a parent only we (or root) can rename entries of, and each
build is reused only when its dir and files are ours, writable by no one else, and its sources
are byte for byte the ones this Harness ships. The bytecode is compiled in checked-hash mode, so
the interpreter itself refuses a .pyc that does not match the source beside it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from harness.service.sandboxes.errors import SandboxUnavailableError

__all__ = [
    "SANDBOX_PYTHON",
    "cache_dir",
    "compiled_supervisor",
    "default_base_dir",
    "grader_python_dir",
]

SANDBOX_PYTHON = "/usr/bin/python3"
_HERE = Path(__file__).parent
_SUPERVISOR_FILES = {
    "supervisor.py": _HERE / "supervisor.py",
    "pid1_commands.py": _HERE / "pid1_commands.py",
    "pid1_events.py": _HERE / "pid1_events.py",
    "pid1_setup.py": _HERE / "pid1_setup.py",
    "relays.py": _HERE / "relays.py",
    "grading_reset.py": _HERE / "grading_reset.py",
    "grading_scratch.py": _HERE / "grading_scratch.py",
    "grading_strict.py": _HERE / "grading_strict.py",
}
_GRADER_FILES = {"sitecustomize.py": _HERE / "grader_site.py"}


def default_base_dir() -> Path:
    """Where a sandbox's host-side dir (control socket, relay sockets, log) and the build cache
    go: $HARNESS_SANDBOX_DIR, else /dev/shm, else the temp dir.

    Measured here: creating and removing a few dirs took ~30 ms on the VM's disk under load and
    under 1 ms on /dev/shm. Only sockets and a small log live there; the sandbox's own files
    live in its tmpfs root, inside its mount namespace.
    """
    override = os.environ.get("HARNESS_SANDBOX_DIR")
    if override:
        path = Path(override)
    else:
        shm = Path("/dev/shm")
        fast = False
        if shm.is_dir() and os.access(shm, os.W_OK):
            st = os.statvfs(shm)
            fast = st.f_bavail * st.f_frsize >= 2 << 30
        path = shm / "harness-sandboxes" if fast else Path(tempfile.gettempdir())
    path.mkdir(parents=True, exist_ok=True)
    return path


def _refuse(path: Path, why: str) -> SandboxUnavailableError:
    return SandboxUnavailableError(
        f"{path}: {why}. It holds code every sandbox runs, so it must be ours alone: remove it "
        "(or set HARNESS_SANDBOX_DIR to a dir of your own) and start again"
    )


def _check_private_dir(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "is not a real directory (a symlink or a file)")
    if st.st_uid != os.getuid():
        raise _refuse(path, f"is owned by uid {st.st_uid}, not by us (uid {os.getuid()})")
    if st.st_mode & 0o022:
        raise _refuse(path, f"is writable by others (mode {st.st_mode & 0o7777:o})")


def cache_dir() -> Path:
    """This uid's build cache, `<base>/harness-code-<uid>` (mode 0700), checked every call.

    Its parent must not let anyone else rename what is in it: owned by us or root, or sticky.
    """
    base = default_base_dir()
    parent = os.stat(base)
    if (
        parent.st_uid not in (0, os.getuid())
        and parent.st_mode & 0o002
        and not (parent.st_mode & stat.S_ISVTX)
    ):
        raise _refuse(base, "is another user's dir that anyone may rename entries of")
    path = base / f"harness-code-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    _check_private_dir(path)
    return path


def _reusable(target: Path, files: dict[str, bytes]) -> bool:
    """True when `target` is a complete build of exactly `files`, ours and writable by no one
    else; False when it is absent. Raises when it is there but not trustworthy."""
    if not os.path.lexists(target):
        return False
    _check_private_dir(target)
    for name, content in files.items():
        path = target / name
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
            raise _refuse(path, "is not a regular file of ours, writable by us alone")
        if path.read_bytes() != content:
            raise _refuse(path, "differs from the source this Harness ships")
    return (target / ".complete").exists()


def _build(name: str, files: dict[str, bytes], compile_them: bool) -> Path:
    digest = hashlib.sha256()
    for dest in sorted(files):
        digest.update(dest.encode() + b"\0" + files[dest] + b"\0")
    root = cache_dir()
    target = root / f"{name}-{digest.hexdigest()[:16]}"
    if _reusable(target, files):
        return target
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
    try:
        for dest, content in files.items():
            (staging / dest).write_bytes(content)
            os.chmod(staging / dest, 0o644)
        if compile_them:
            _compile(staging, list(files))
        (staging / ".complete").touch()
        os.chmod(staging, 0o755)  # the sandbox's uid is ours; others need not read it
        try:
            staging.rename(target)
        except OSError:  # another process of ours got there first: check theirs
            shutil.rmtree(staging, ignore_errors=True)
            if not _reusable(target, files):
                raise _refuse(target, "is an incomplete build") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _check_private_dir(target)
    return target


def _compile(staging: Path, names: list[str]) -> None:
    script = (
        "import py_compile, sys\n"
        "for path in sys.argv[1:]:\n"
        "    py_compile.compile(path, doraise=True,\n"
        "        invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)\n"
    )
    result = subprocess.run(
        [SANDBOX_PYTHON, "-I", "-S", "-c", script, *(str(staging / n) for n in names)],
        capture_output=True,
        timeout=120,
    )
    if result.returncode != 0:
        raise SandboxUnavailableError(
            f"{SANDBOX_PYTHON} could not compile the sandbox supervisor (it needs Python >= "
            f"3.9): {result.stderr.decode(errors='replace')[-500:]}"
        )


@functools.lru_cache(maxsize=1)
def _supervisor_sources() -> dict[str, bytes]:
    """The supervisor's files as this process first read them (what it builds and checks)."""
    return {dest: src.read_bytes() for dest, src in _SUPERVISOR_FILES.items()}


@functools.lru_cache(maxsize=1)
def _supervisor_build() -> Path:
    return _build("supervisor", _supervisor_sources(), compile_them=True)


def compiled_supervisor() -> Path:
    """The supervisor's dir (sources and checked-hash bytecode), built once per source hash.

    Passing the source with `-c` made every start compile it again (~3-10 ms of CPU measured
    here); the sandbox imports the cached .pyc instead. The dir is checked again at every call
    (a few stats and a compare), since it lives on a shared filesystem.
    """
    target = _supervisor_build()
    _reusable(target, _supervisor_sources())
    return target


def grader_python_dir() -> Path:
    """The dir put first on the grader's PYTHONPATH (its sitecustomize.py: grader_site.py)."""
    files = {dest: src.read_bytes() for dest, src in _GRADER_FILES.items()}
    return _build("grader-python", files, compile_them=False)
