"""What the sandbox's pid 1 does once, with its two capabilities, before anything else runs.

Runs inside the sandbox, imported by supervisor.py (so: the standard library only, Python >= 3.9,
no Harness imports). bwrap starts pid 1 with CAP_SYS_ADMIN and CAP_SETPCAP in the sandbox's own
user namespace (and nothing else); `harden_dev()` uses the first, `drop_capabilities()` then
throws both away for good (bounding set emptied, capset to zero), before the supervisor reads
its first command. No command ever runs with a capability.

Why: bwrap's `--dev /dev` bind-mounts the host's device nodes (null, zero, full, random, urandom,
tty) read-write. The sandbox's uid 0 is the host's uid, so on a root host `chmod` or `touch` on
/dev/null inside changed the host's /dev/null (issue 29, finding 4). bwrap can bind read-only
only with nodev (the nodes then refuse to open), so pid 1 remounts each node read-only itself,
keeping the flags the kernel locked on them. The /dev tmpfs itself is read-only from bwrap's
`--remount-ro /dev` (so /dev/fd, /dev/stdin, ... stay the kernel's links whatever the agent
does: finding 1), and /dev/shm is a capped tmpfs of its own (mounts.py).
"""

import ctypes
import os

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND = 32, 4096
_MS_NOATIME, _MS_NODIRATIME, _MS_RELATIME = 1024, 2048, 1 << 21
# statvfs's ST_* bit -> mount(2)'s MS_* flag (equal but for relatime: ST 4096, MS 1 << 21)
_ST_TO_MS = (
    (2, _MS_NOSUID),
    (4, _MS_NODEV),
    (8, _MS_NOEXEC),
    (1024, _MS_NOATIME),
    (2048, _MS_NODIRATIME),
    (4096, _MS_RELATIME),
)
_PR_CAPBSET_DROP = 24
_CAP_LAST = 63
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _error(what):
    errno = ctypes.get_errno()
    return OSError(errno, f"{what}: {os.strerror(errno)}")


def harden_dev(nodes):
    """Remount each of `nodes` (device nodes bound from the host) read-only, devices allowed.

    The flags the kernel locked when the mount entered this user namespace (nosuid, the atime
    ones) must be passed again, or the remount is refused: they are read back with statvfs.
    """
    for path in nodes:
        if not os.path.exists(path):
            continue
        st_flags = os.statvfs(path).f_flag
        flags = 0
        for st_bit, ms_flag in _ST_TO_MS:
            if st_flags & st_bit:
                flags |= ms_flag
        if (
            _libc.mount(
                None, path.encode(), None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags, None
            )
            != 0
        ):
            raise _error(f"remount {path} read-only")


def drop_capabilities():
    """Empty the bounding set, then every capability set: for good, for us and our children."""
    for cap in range(_CAP_LAST + 1):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            raise _error(f"drop capability {cap} from the bounding set")  # 22: no such cap
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise _error("capset to nothing")
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("CapEff:", "CapPrm:", "CapBnd:")) and int(line.split()[1], 16):
                raise OSError(f"capabilities left after the drop: {line.strip()}")
