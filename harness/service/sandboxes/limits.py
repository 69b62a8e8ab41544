"""Resource limits for a local sandbox, and the one decision of how to enforce the process cap.

Limits that rlimits enforce everywhere (set by the in-sandbox supervisor, inherited by every
command): file size (RLIMIT_FSIZE), open files (RLIMIT_NOFILE), no core dumps, and the wall time
of each command (its process group is SIGKILLed at the deadline).

The process cap is the awkward one. RLIMIT_NPROC is ignored for processes whose real uid is host
root (the kernel exempts INIT_USER), and bubblewrap run by root maps the sandbox's uid 0 to host
uid 0, so on a root host (this machine, CI) RLIMIT_NPROC alone does nothing. So the process cap
(and the optional memory cap) is enforced with a cgroup when one is writable:

- cgroup v1 with a `pids` hierarchy at /sys/fs/cgroup/pids (measured here: a firecracker VM
  with v1 controllers mounted rw),
- cgroup v2 when the process's own cgroup lists `pids` in cgroup.subtree_control,

and RLIMIT_NPROC is set in every case (it works when the host user is not root). Which path is in
force is decided once per process and logged with its reason (`process_cap_mode()`).

It refuses to pretend: when no cgroup is writable on a root host, `process_cap_mode()` says
"rlimit-only (not enforced for root)" instead of claiming a cap.
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcessCgroup", "SandboxLimits", "process_cap_mode"]

logger = logging.getLogger(__name__)

_V1_PIDS = Path("/sys/fs/cgroup/pids")
_V1_MEMORY = Path("/sys/fs/cgroup/memory")
_V2_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-sandbox caps. `None` means no cap for that resource."""

    max_processes: int | None = 512
    max_file_size_mb: int | None = 1024
    max_open_files: int | None = 4096
    # cgroup only. Also bounds what the agent writes to its private root when that is on
    # /dev/shm (tmpfs pages are charged to the writer's cgroup). A task's [environment].memory_mb
    # replaces it (BwrapEnvironment).
    memory_mb: int | None = 4096
    default_exec_timeout_s: float | None = None  # used when exec() gets no timeout
    # Size of the private root (a tmpfs: RAM). A task's [environment].storage_mb replaces it.
    # With a memory cap it is held to half of it, so a full root leaves room to grade.
    disk_mb: int = 2048

    def disk_bytes(self) -> int:
        """Everything the sandbox may write: its root plus its /dev/shm (both RAM)."""
        disk = self.disk_mb
        if self.memory_mb:
            disk = min(disk, max(64, self.memory_mb // 2))
        return disk << 20

    def shm_size_bytes(self) -> int:
        """The sandbox's /dev/shm (a tmpfs of its own): an eighth of the disk, at most 64 MiB.

        Counted in disk_mb: the root gets the rest. The rest of /dev is read-only.
        """
        return min(64 << 20, self.disk_bytes() // 8)

    def root_size_bytes(self) -> int:
        return self.disk_bytes() - self.shm_size_bytes()

    def rlimits(self) -> dict[str, int]:
        """The rlimits the supervisor sets on itself (and so on every command)."""
        out = {"core": 0}
        if self.max_processes is not None:
            out["nproc"] = self.max_processes
        if self.max_file_size_mb is not None:
            out["fsize"] = self.max_file_size_mb * 1024 * 1024
        if self.max_open_files is not None:
            out["nofile"] = self.max_open_files
        return out


def _own_v2_cgroup() -> Path | None:
    try:
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            if line.startswith("0::"):
                return _V2_ROOT / line[3:].lstrip("/")
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=1)
def process_cap_mode() -> tuple[str, str]:
    """(mode, reason): "cgroup-v1", "cgroup-v2" or "rlimit-only". Decided once per process."""
    root_host = os.geteuid() == 0
    if (_V1_PIDS / "cgroup.procs").exists() and os.access(_V1_PIDS, os.W_OK):
        mode, reason = "cgroup-v1", f"{_V1_PIDS} is a writable cgroup v1 pids hierarchy"
    else:
        own = _own_v2_cgroup()
        controllers = own / "cgroup.subtree_control" if own else None
        if (
            own is not None
            and controllers is not None
            and controllers.exists()
            and "pids" in controllers.read_text().split()
            and os.access(own, os.W_OK)
        ):
            mode, reason = "cgroup-v2", f"{own} delegates the pids controller"
        else:
            hint = " (not enforced: the host user is root)" if root_host else ""
            mode, reason = "rlimit-only", f"no writable pids cgroup; RLIMIT_NPROC only{hint}"
    logger.info("sandbox process cap: %s (%s)", mode, reason)
    return mode, reason


class ProcessCgroup:
    """A per-sandbox cgroup capping processes (and memory where v1 memory is writable).

    `create()` returns None when no cgroup can be used; `procs_file` is where the sandbox's first
    process writes its own pid (so every descendant is born inside); `remove()` deletes it once
    the sandbox's processes are gone.
    """

    def __init__(self, dirs: list[Path], procs_files: list[Path], memory: bool = False):
        self.dirs = dirs
        self.procs_files = procs_files
        self.memory = memory  # whether a memory cap is in force too

    @classmethod
    def create(cls, name: str, limits: SandboxLimits) -> ProcessCgroup | None:
        mode, _ = process_cap_mode()
        if mode == "rlimit-only" or limits.max_processes is None:
            return None
        leaf = f"harness-{name}-{uuid.uuid4().hex[:8]}"
        dirs: list[Path] = []
        try:
            if mode == "cgroup-v1":
                pids = _V1_PIDS / leaf
                pids.mkdir()
                dirs.append(pids)
                (pids / "pids.max").write_text(str(limits.max_processes))
                if limits.memory_mb and os.access(_V1_MEMORY, os.W_OK):
                    mem = _V1_MEMORY / leaf
                    mem.mkdir()
                    dirs.append(mem)
                    (mem / "memory.limit_in_bytes").write_text(str(limits.memory_mb << 20))
                return cls(dirs, [d / "cgroup.procs" for d in dirs], memory=len(dirs) == 2)
            own = _own_v2_cgroup()
            assert own is not None
            group = own / leaf
            group.mkdir()
            dirs.append(group)
            (group / "pids.max").write_text(str(limits.max_processes))
            memory = bool(limits.memory_mb and (group / "memory.max").exists())
            if memory:
                (group / "memory.max").write_text(str(limits.memory_mb << 20))
            return cls(dirs, [group / "cgroup.procs"], memory=memory)
        except OSError as exc:
            logger.warning("could not create the sandbox cgroup (%s); rlimits only", exc)
            cls(dirs, []).remove()
            return None

    def wrap(self, argv: list[str]) -> list[str]:
        """Prefix argv so the process joins the cgroup(s) before it execs (no race with forks)."""
        joins = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(self.procs_files)))
        script = f'{joins} && shift {len(self.procs_files)} && exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *map(str, self.procs_files), *argv]

    def remove(self) -> None:
        """Delete the cgroup(s); a just-killed process may take a moment to leave them."""
        for d in self.dirs:
            for attempt in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if attempt == 49:
                        logger.warning("sandbox cgroup %s not removed: %s", d, exc)
                    time.sleep(0.01)
