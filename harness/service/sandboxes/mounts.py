"""The filesystem a local sandbox sees, written out as a bubblewrap command line.

One decision: the sandbox's `/` is a private, writable tmpfs of bwrap's own (size-capped, gone
with the sandbox's mount namespace at stop), and the host shows through only as read-only binds
on top of it:

    /                 private tmpfs (writable): /app or the task's WORKDIR, /tmp, /logs, /root,
                      and whatever Harbor uploads later (/tests at verify time, /solution, ...)
    /usr, /etc        host, read-only; /etc files that are not world-readable are masked
    /bin /lib ...     symlinks into /usr, as on a merged-/usr host (bound when they are real dirs)
    /proc             fresh procfs for the sandbox's pid namespace
    /dev              bwrap's minimal /dev, read-only: its links (fd, stdin, stdout, stderr, ptmx)
                      are the kernel's whatever the agent does, and the host's device nodes in
                      it (DEV_NODES) are remounted read-only by pid 1 (pid1_setup.py), so no
                      chmod or touch inside reaches the host's nodes
    /dev/shm          a tmpfs of its own, capped (SandboxLimits.shm_size_bytes, part of disk_mb)
    /run/harness      host dir with the unix sockets of forwarded ports (read-only)
    extra binds       `ro_binds` {host path: sandbox path}, e.g. the agent CLIs and their venvs

Why not `--ro-bind / /`: DESIGN.md section 5 measured that with `/` read-only bubblewrap cannot
create Harbor's mount points (/app, /tests, /logs); building the root from binds of /usr and /etc
on a writable private root can, and it ran a Harbor task's solve.sh and test.sh. Why a tmpfs
and not a host dir bound at `/` (the first design): tmpfs pages are charged to the sandbox's
memory cgroup, and measured here an agent filling an uncapped root brought the cgroup to its
limit, where any allocation, the supervisor's included, OOM-killed the sandbox. A capped tmpfs
turns that into ENOSPC for the writer. It also needs no host-side delete at stop.

Why the masks: the sandbox runs as uid 0 of a user namespace that maps to the host uid, so on a
root host it can read root-only files in what is bound. /etc's non-world-readable files (shadow,
gshadow, service configs) are replaced by /dev/null; /usr holds no secrets on a normal host.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "BASE_PATH",
    "DEV_NODES",
    "bwrap_argv",
    "masked_etc_files",
    "resolved_tool_binds",
    "usr_links",
    "venv_binds",
]

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NET_DIR_IN_SANDBOX = "/run/harness"

# Top-level host entries the sandbox gets: read-only directories, and the merged-/usr symlinks.
_RO_DIRS = ("/usr", "/etc")
_USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The host device nodes bwrap's --dev binds in (its list); pid 1 remounts them read-only.
DEV_NODES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


@functools.lru_cache(maxsize=1)
def masked_etc_files() -> tuple[str, ...]:
    """Regular files under /etc that others cannot read (decided once per process)."""
    masked: list[str] = []
    for dirpath, dirnames, filenames in os.walk("/etc"):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for name in filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not (st.st_mode & 0o004) and os.path.isfile(path) and not os.path.islink(path):
                masked.append(path)
    return tuple(sorted(masked))


def bwrap_argv(
    *,
    root_size_bytes: int,
    shm_size_bytes: int = 64 << 20,
    dirs: list[str],
    net_dir: Path | None,
    ro_binds: Mapping[str, str],
    hostname: str,
    info_fd: int,
    command: list[str],
) -> list[str]:
    """The full `bwrap ...` argv: namespaces, root, binds, then `command` as the only process."""
    argv = [
        "bwrap",
        "--unshare-all",  # user, pid, net (loopback only), ipc, uts, cgroup
        "--die-with-parent",
        "--as-pid-1",  # the supervisor is pid 1: unkillable from inside (see supervisor.py)
        "--new-session",  # no TIOCSTI into the host's terminal
        "--cap-drop",
        "ALL",
        # For pid 1 alone, and only until it has remounted the device nodes read-only: it then
        # drops them and its bounding set for good (pid1_setup.py). No command has any.
        "--cap-add",
        "CAP_SYS_ADMIN",
        "--cap-add",
        "CAP_SETPCAP",
        "--clearenv",
        "--setenv",
        "PATH",
        BASE_PATH,
        "--setenv",
        "HOME",
        "/root",
        "--hostname",
        hostname,
        # The private root: a tmpfs of bwrap's own, capped (a full root is ENOSPC for the
        # writer, never an OOM of the sandbox), gone with the mount namespace at stop.
        "--size",
        str(root_size_bytes),
        "--tmpfs",
        "/",
    ]
    for path in dirs:
        argv += ["--perms", "1777" if path == "/tmp" else "0755", "--dir", path]
    for path in _RO_DIRS:
        argv += ["--ro-bind", path, path]
    for path in masked_etc_files():
        argv += ["--ro-bind", "/dev/null", path]
    links = dict(usr_links())
    for link in _USR_LINKS:
        if link in links:
            argv += ["--symlink", links[link], link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    argv += ["--perms", "1777", "--size", str(shm_size_bytes), "--tmpfs", "/dev/shm"]
    if net_dir is not None:
        argv += ["--ro-bind", str(net_dir), NET_DIR_IN_SANDBOX]
    for host, target in ro_binds.items():
        argv += ["--ro-bind", str(host), str(target)]
    argv += ["--chdir", "/", "--info-fd", str(info_fd), *command]
    return argv


@functools.lru_cache(maxsize=1)
def usr_links() -> tuple[tuple[str, str], ...]:
    """The host's merged-/usr symlinks, (path, target), as the sandbox gets them.

    They live in the sandbox's writable root, so the grading reset puts them back
    (`BwrapSandbox.prepare_grading`): a /bin of the agent's would run the grader's shebang.
    """
    return tuple((link, os.readlink(link)) for link in _USR_LINKS if os.path.islink(link))


def resolved_tool_binds(*paths: str | os.PathLike[str]) -> dict[str, str]:
    """Identity binds that make host tools runnable inside at the paths the host uses.

    Each path is resolved (e.g. /work/main/.tools -> ~/.cache/harness/tools/npm-*/node_modules/.bin)
    and the bind covers its npm prefix or venv, so symlinked entry points and absolute shebangs
    keep working. A venv also brings the Python it was made from (pyvenv.cfg `home`).
    """
    binds: dict[str, str] = {}
    for raw in paths:
        path = Path(raw).resolve()
        if not path.exists():
            raise FileNotFoundError(f"{raw} does not exist; run ./setup.sh to install the tools")
        root = path
        for parent in [path, *path.parents]:
            if parent.name == "node_modules":
                root = parent.parent
                break
            if (parent / "pyvenv.cfg").exists():
                binds.update(venv_binds(parent))
                root = parent
                break
        binds[str(root)] = str(root)
    return _drop_nested(binds)


def venv_binds(venv: str | os.PathLike[str]) -> dict[str, str]:
    """Identity binds for a venv and the base Python install its `home` points at."""
    venv = Path(venv).resolve()
    binds = {str(venv): str(venv)}
    cfg = venv / "pyvenv.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                home = Path(value.strip()).resolve()
                base = home.parent if home.name == "bin" else home
                if not str(base).startswith("/usr"):
                    binds[str(base)] = str(base)
    return _drop_nested(binds)


def _drop_nested(binds: dict[str, str]) -> dict[str, str]:
    """Drop identity binds already covered by a shorter one (a bind inside a bind is redundant)."""
    keep: dict[str, str] = {}
    for host in sorted(binds, key=len):
        if binds[host] == host and any(
            host.startswith(k.rstrip("/") + "/") and keep[k] == k for k in keep
        ):
            continue
        keep[host] = binds[host]
    return keep
