"""One command's life inside the sandbox: spawned, its pipes relayed to the host, reaped (run by
pid 1).

Runs inside the sandbox, imported by supervisor.py at its start (the standard library only,
Python >= 3.9; no `json`, `socket` or `selectors`, for start-up time: see supervisor.py). The
supervisor reads each control connection's header and hands a command here: `_spawn` starts it
under oom_score_adj 1000 in its own process group, `_on_pipe`/`_on_stdin` move its bytes, and
the exit frame (`b"x"`) goes out once it has exited and its pipes have drained (at most
`_DRAIN_AFTER_EXIT_S` after the exit: background children may hold them open). Frames and the
header are described in supervisor.py's docstring.
"""

import marshal
import os
import signal
import struct
import time

from pid1_events import _CHUNK, _IN, _OUT, _modify, _register, _unregister

_DRAIN_AFTER_EXIT_S = 0.2  # background children may hold stdout open; do not wait for them
_execs = set()
_by_pid = {}  # pid of a command's process -> its _Exec, until reaped


class _Exec:
    """One command: its connection to the host, its pipes, its process."""

    def __init__(self, conn):
        self.conn = conn
        self.inbuf = b""
        self.header = None
        self.stdin_data = b""
        self.out = bytearray()
        self.pid = None
        self.pipes = {}  # fd -> frame type
        self.stdin_fd = None
        self.deadline = None
        self.timed_out = False
        self.exited_at = None
        self.rc = None
        self.finished = False
        self.closed = False


def _frame(kind, payload):
    return kind + struct.pack(">I", len(payload)) + payload


def _send(ex, kind, payload):
    ex.out += _frame(kind, payload)
    if not ex.closed:
        _modify(ex.conn.fileno(), _IN | _OUT)


def _exit_frame(ex, rc, timed_out, error):
    _send(ex, b"x", marshal.dumps({"rc": rc, "timed_out": timed_out, "error": error}, 4))
    ex.finished = True


def _kill_group(ex):
    if ex.pid is not None and ex.rc is None:
        try:  # noqa: SIM105 (contextlib costs start-up time here)
            os.killpg(ex.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _close_fd(fd):
    _unregister(fd)
    os.close(fd)


def _close_exec(ex):
    if ex.closed:
        return
    ex.closed = True
    _kill_group(ex)
    for fd in list(ex.pipes):
        _close_fd(fd)
    ex.pipes.clear()
    if ex.stdin_fd is not None:
        _close_fd(ex.stdin_fd)
        ex.stdin_fd = None
    _unregister(ex.conn.fileno())
    ex.conn.close()
    _execs.discard(ex)


def _set_oom_score(value):
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    except OSError:
        return
    try:
        os.write(fd, value)
    except OSError:
        pass
    finally:
        os.close(fd)


def _spawn(ex):
    header = ex.header
    argv = header["argv"]
    env = header.get("env") or {}
    cwd = header.get("cwd") or "/"
    timeout = header.get("timeout")
    fds = ()
    try:
        for _ in range(3):
            fds += os.pipe()
    except OSError as exc:  # out of descriptors: this command fails, pid 1 does not
        for fd in fds:
            os.close(fd)
        _exit_frame(ex, 126, False, f"cannot start a command: {exc.strerror}")
        return
    out_r, out_w, err_r, err_w, in_r, in_w = fds
    actions = [
        (os.POSIX_SPAWN_DUP2, in_r, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    # posix_spawn has no cwd parameter in Python; this process is single-threaded, so changing
    # its own directory around the spawn is safe (and far cheaper than forking a Python process).
    try:
        os.chdir(cwd)
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        _exit_frame(ex, 126, False, f"cannot enter working directory {cwd!r}: {exc.strerror}")
        return
    # Spawn under oom_score_adj 1000 so the command (and all it forks) is the OOM killer's first
    # choice, then take ours back to 0. Measured with a 64 MiB memory cgroup: an agent filling
    # its tmpfs root got *us* killed (the largest process), taking the sandbox and the verifier
    # down. Setting the child's score after the spawn raced with its first fork. Values >= 0
    # need no capability (a negative one would need CAP_SYS_RESOURCE, lacking even to host root
    # on this VM).
    _set_oom_score(b"1000")
    try:
        pid = os.posix_spawnp(
            argv[0],
            argv,
            {str(k): str(v) for k, v in env.items()},
            file_actions=actions,
            setsid=True,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM),
        )
    except OSError as exc:
        for fd in fds:
            os.close(fd)
        _exit_frame(ex, 127, False, f"cannot start {argv[0]!r}: {exc.strerror}")
        return
    finally:
        os.chdir("/")
        _set_oom_score(b"0")
    for fd in (out_w, err_w, in_r):
        os.close(fd)
    ex.pid = pid
    _by_pid[pid] = ex
    for fd, kind in ((out_r, b"o"), (err_r, b"e")):
        os.set_blocking(fd, False)
        ex.pipes[fd] = kind
        _register(fd, _IN, "pipe", ex)
    if ex.stdin_data:
        os.set_blocking(in_w, False)
        ex.stdin_fd = in_w
        _register(in_w, _OUT, "stdin", ex)
    else:
        os.close(in_w)
    if timeout:
        ex.deadline = time.monotonic() + float(timeout)


def _on_stdin(ex):
    try:
        sent = os.write(ex.stdin_fd, ex.stdin_data)
        ex.stdin_data = ex.stdin_data[sent:]
    except BlockingIOError:
        return
    except OSError:
        ex.stdin_data = b""
    if not ex.stdin_data:
        _close_fd(ex.stdin_fd)
        ex.stdin_fd = None


def _on_pipe(ex, fd):
    try:
        data = os.read(fd, _CHUNK)
    except BlockingIOError:
        return
    if data:
        _send(ex, ex.pipes[fd], data)
        return
    _close_fd(fd)
    del ex.pipes[fd]


def _reap():
    """Reap every exited child: ours (record the exit code) and orphans (we are pid 1)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        ex = _by_pid.pop(pid, None)
        if ex is None or ex.rc is not None:
            continue
        ex.rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
        ex.exited_at = time.monotonic()


def _maybe_finish(ex, now):
    if ex.finished or ex.rc is None:
        return
    if ex.pipes and now - ex.exited_at < _DRAIN_AFTER_EXIT_S:
        return
    for fd in list(ex.pipes):
        _close_fd(fd)
    ex.pipes.clear()
    _exit_frame(ex, ex.rc, ex.timed_out, None)
