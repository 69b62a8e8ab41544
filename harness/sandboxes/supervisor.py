"""The process that lives inside a local sandbox: runs commands and forwards proxy ports.

This file runs *inside* the bubblewrap sandbox, under the host's /usr/bin/python3 (whatever
version that is, >= 3.9), so it imports nothing from Harness and only the cheapest parts of the
standard library: its start-up is most of the sandbox's start-up. Measured with -X importtime:
`json` (through `re`), `socket` (through `enum`), `selectors` and `contextlib` (through
`functools`/`collections`) were ~3/4 of the import time, so it uses `marshal`, `_socket` and
`select.epoll` directly. Keep it that way (and keep its syntax valid on Python 3.9).

The host compiles it once with that python3 (supervisor_build.py), binds the result
read-only at /run/harness-supervisor, and starts it as the sandbox's pid 1 (`bwrap --as-pid-1`) and talks to it over one listening
unix socket whose file descriptor it inherits (the socket's path lives in a host directory the
sandbox cannot see, so nothing inside can open a second control connection). As pid 1 it is
immune to signals sent from inside the sandbox (an agent's `kill -9 -1` or `pkill python3`) and
it reaps orphaned processes.

Why a resident process instead of one `bwrap` per command: Harbor's environments keep state
between `exec` calls (background servers, the network namespace), and a fresh namespace per
command would lose them and pay the namespace set-up each time.

Control protocol, one connection per command (marshal, version 4, plain dicts/lists/str/num).
Two headers are requests to the supervisor itself, answered with one marshal dict on stdout:
{"op": "killall"} SIGKILLs every process in the sandbox but pid 1 until none is left
({"killed", "survivors"}); {"op": "grading_reset", "paths": [[path, mode, wipe], ...]} does the
same, then restores the image's merged-/usr symlinks and the grader hook files and makes each
grading path a fresh real directory (see `_grading_reset`). Commands:
    host -> supervisor   4-byte big-endian length + marshal {"argv", "env", "cwd", "timeout",
                         "stdin_len"}, then `stdin_len` raw bytes for the command's stdin
    supervisor -> host   frames: 1 type byte + 4-byte big-endian length + payload
                         b"o" stdout bytes, b"e" stderr bytes,
                         b"x" marshal {"rc": int, "timed_out": bool, "error": str | None} (last)
If the host closes the connection before the exit frame, the command's whole process group is
killed: that is how a cancelled `exec` on the host cleans up after itself.

Port forwarding: for each configured port the supervisor listens on 127.0.0.1:PORT inside the
sandbox's own network namespace (which has nothing but loopback) and relays every connection to
a unix socket bound in from the host, where the host relays it on to the real TCP address (the
capture proxy). Nothing else on the host is reachable.

Limits set here are inherited by every command: RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no
core dumps. A command past its deadline has its process group SIGKILLed.

Before anything else it remounts the host's device nodes read-only and drops its capabilities
for good (pid1_setup.py). The grading reset's scratch and toolchain parts are in
grading_scratch.py, strict mode's in grading_strict.py (imported only then). It must outlive anything the agent does: a connection
flood at a forwarded port meets a relay cap and, out of descriptors, a reserved fd that lets
accept drain the queue; a handler that fails closes its own connection only. If pid 1 dies
anyway, the host scores the rollout `tampered` (errors.SandboxDiedError).

It refuses to do anything else: no file transfer primitives (the host streams tar through `exec`,
so every path is resolved inside the sandbox's view and an agent's symlink cannot point a host
write at a host file), no shell of its own, no retries.
"""

import _socket
import marshal
import os
import resource
import select
import signal
import struct
import sys
import time

_CHUNK = 65536
_MAX_PENDING = 8 * 1024 * 1024  # stop reading a relay side while this much is unsent
_DRAIN_AFTER_EXIT_S = 0.2  # background children may hold stdout open; do not wait for them
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_ERR = select.EPOLLHUP | select.EPOLLERR

_ep = select.epoll()
_handlers = {}  # fd -> (kind, object)
_execs = set()
_by_pid = {}  # pid of a command's process -> its _Exec, until reaped


def _log(message):
    sys.stderr.write("[supervisor] " + message + "\n")
    sys.stderr.flush()


def _register(fd, events, kind, obj):
    _handlers[fd] = (kind, obj)
    _ep.register(fd, events)


def _modify(fd, events):
    _ep.modify(fd, events)


def _unregister(fd):
    if _handlers.pop(fd, None) is not None:
        try:  # noqa: SIM105 (contextlib costs start-up time here)
            _ep.unregister(fd)
        except (OSError, ValueError):
            pass


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


class _Relay:
    """One forwarded connection: two sockets and the bytes waiting to go each way."""

    def __init__(self, a, b):
        self.socks = (a, b)
        self.pending = {a.fileno(): bytearray(), b.fileno(): bytearray()}  # bytes to send *to* fd
        self.eof = {a.fileno(): False, b.fileno(): False}  # fd has sent EOF
        self.closed = False

    def other(self, sock):
        return self.socks[1] if sock is self.socks[0] else self.socks[0]


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


def _on_conn(ex, events):
    if events & (_OUT | _ERR) and ex.out:
        try:
            sent = ex.conn.send(ex.out)
            del ex.out[:sent]
        except BlockingIOError:
            pass
        except OSError:
            _close_exec(ex)
            return
        if not ex.out and ex.finished:
            _close_exec(ex)
            return
        _modify(ex.conn.fileno(), _IN | (_OUT if ex.out else 0))
    if events & (_IN | _ERR):
        try:
            data = ex.conn.recv(_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            # The host hung up (a cancelled exec): kill what it started.
            _close_exec(ex)
            return
        ex.inbuf += data
        if ex.header is None:
            if len(ex.inbuf) < 4:
                return
            (length,) = struct.unpack(">I", ex.inbuf[:4])
            if len(ex.inbuf) < 4 + length:
                return
            ex.header = marshal.loads(ex.inbuf[4 : 4 + length])
            ex.inbuf = ex.inbuf[4 + length :]
        op = ex.header.get("op")
        if op == "killall" and not ex.finished:
            killed, survivors = _killall()
            _send(ex, b"o", marshal.dumps({"killed": killed, "survivors": survivors}, 4))
            _exit_frame(ex, 1 if survivors else 0, False, None)
            return
        if op == "grading_reset" and not ex.finished:
            _send(ex, b"o", marshal.dumps(_grading_reset(ex.header), 4))
            _exit_frame(ex, 0, False, None)
            return
        if ex.pid is None and not ex.finished:
            need = int(ex.header.get("stdin_len") or 0)
            if len(ex.inbuf) >= need:
                ex.stdin_data = bytes(ex.inbuf[:need])
                ex.inbuf = b""
                _spawn(ex)


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


def _other_pids():
    """Every process of the sandbox's pid namespace but us, read from its own /proc."""
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and name != "1"]


def _killall(timeout_s=10.0):
    """SIGKILL every process in the sandbox but us, until none is left; (killed, survivors).

    Decided from the pid namespace, not from any process group: `kill(-1)` from pid 1 reaches
    every process of the namespace (setsid daemons, double forks, nested pid namespaces, which
    all have a pid here) but pid 1 itself. A fork racing the kill cannot slip through: the
    kernel fails a fork whose parent has a pending SIGKILL. Done means both: no child left to
    reap (as pid 1 we inherit every orphan) and nothing but pid 1 in /proc.
    """
    seen = set()
    deadline = time.monotonic() + timeout_s
    while True:
        others = _other_pids()
        seen.update(others)
        if others:
            try:  # noqa: SIM105 (contextlib costs start-up time here)
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        children = True
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children = False
                break
            if pid == 0:
                break
            ex = _by_pid.pop(pid, None)
            if ex is not None and ex.rc is None:
                ex.rc = 128 + signal.SIGKILL
                ex.exited_at = time.monotonic()
        if not others and not children:
            return len(seen), []
        if time.monotonic() >= deadline:
            return len(seen), [_describe(pid) for pid in _other_pids()]
        time.sleep(0.002)  # still dying (never block: one could be stuck in the kernel)


def _describe(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return str(pid)
    name = stat[stat.find("(") : stat.rfind(")") + 1 or None]
    return f"{pid} {name[:80]}"


def _wipe_tree(top):
    """Remove everything under the real directory `top` (iterative: an agent may nest deep).

    Directories are made writable first: the agent may have left them 0555 or 0000, and we are
    their owner without CAP_DAC_OVERRIDE. Symlinks are removed, never followed.
    """
    dirs = []
    stack = [top]
    while stack:
        d = stack.pop()
        os.chmod(d, 0o700)
        dirs.append(d)
        with os.scandir(d) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for d in reversed(dirs[1:]):  # each dir was listed after its parent: children go first
        os.rmdir(d)


def _reset_path(path, mode, wipe, found):
    """Make `path` a real directory with `mode` (and empty, if `wipe`); note what was there."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not _is_dir(st.st_mode):
        kind = f"a symlink to {os.readlink(path)!r}" if _is_link(st.st_mode) else "not a dir"
        found.append(f"{path} was {kind}")
        os.unlink(path)
        st = None
    if st is None:
        os.mkdir(path, mode)
    elif st.st_mode & 0o700 != 0o700:  # locked against its owner: a lock, not a preference
        found.append(f"{path} was locked (mode {st.st_mode & 0o7777:o})")
    if wipe:
        names = os.listdir(path) if os.access(path, os.R_OK | os.X_OK) else ["(unreadable)"]
        if names:
            shown = ", ".join(sorted(names)[:5])
            found.append(f"{path} held {len(names)} entries: {shown}")
            _wipe_tree(path)
    os.chmod(path, mode)


def _is_dir(mode):
    return (mode & 0o170000) == 0o040000


def _is_link(mode):
    return (mode & 0o170000) == 0o120000


_HOOK_LIMIT = 1 << 20  # a grader hook file larger than this is compared by size alone
_image_hooks = {}  # hook path -> its bytes as the image left them (see _reset_hooks)


def _read_hook(path):
    """A hook path's content: bytes for a regular file, None when absent, a str otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if _is_link(st.st_mode):
        return f"a symlink to {os.readlink(path)!r}"
    if _is_dir(st.st_mode):
        return "a directory"
    if (st.st_mode & 0o170000) != 0o100000:
        return "not a regular file"
    if st.st_size > _HOOK_LIMIT:
        return f"a file of {st.st_size} bytes"
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        return f"unreadable ({exc.strerror})"


def _remove_any(path):
    st = os.lstat(path)
    if _is_dir(st.st_mode):
        _wipe_tree(path)
        os.rmdir(path)
    else:
        os.unlink(path)


def _reset_hooks(paths, record, found):
    """Files the grader's tools read uninvited (pytest's config and conftest.py in an ancestor
    of /tests): back to what the image had. `record` (the reset after the image's build) takes
    that state as the image's; later resets report and undo any difference."""
    if record:
        _image_hooks.clear()
        for path in paths:
            content = _read_hook(path)
            if isinstance(content, bytes):
                _image_hooks[path] = content
        return
    for path in paths:
        content = _read_hook(path)
        image = _image_hooks.get(path)
        if content == image:
            continue
        what = "changed" if image is not None and content is not None else "planted"
        if content is None:
            what = "removed"
        elif not isinstance(content, bytes):
            what = content
        found.append(f"{path} (read by the grader's tools) was {what}")
        if content is not None:
            _remove_any(path)
        if image is not None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, image)
            finally:
                os.close(fd)


def _reset_link(path, target, found):
    """`path` back to a symlink to `target` (the merged-/usr links: /bin, /lib64, ...).

    They live in the writable root: an agent that replaced /bin with a dir of its own would
    own the grader's `#!/bin/bash`, and /lib64 its dynamic loader."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and _is_link(st.st_mode) and os.readlink(path) == target:
        return
    found.append(f"{path} was not the image's symlink to {target}")
    if st is not None:
        _remove_any(path)
    os.symlink(target, path)


def _grading_reset(header):
    """Before grading: no process of the agent alive, grading dirs fresh; report what was found.

    `header["paths"]`: [path, mode, wipe] in order (parents first); `header["links"]`: [path,
    target] symlinks of the image to restore; `header["hooks"]`: files the grader's tools would
    read uninvited, put back as they were at the `header["record"]` reset. Returns a dict:
    killed, survivors (processes still alive at the deadline), found (agent state in or above
    the grading dirs, now removed), errors (what could not be reset), reset (the agent's scratch
    files and toolchain config put back: not evidence, see grading_scratch.py), free_bytes /
    free_inodes of the sandbox's root after the reset.
    """
    killed, survivors = _killall(float(header.get("timeout") or 10.0))
    found, errors, reset = [], [], []
    if not survivors:  # a survivor could undo the reset: leave the dirs as evidence instead
        for path, target in header.get("links") or ():
            try:
                _reset_link(path, target, found)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
        for path, mode, wipe in header.get("paths") or ():
            try:
                _reset_path(path, int(mode), bool(wipe), found)
            except OSError as exc:
                errors.append(f"{path}: {exc}")
        try:
            _reset_hooks(list(header.get("hooks") or ()), bool(header.get("record")), found)
        except OSError as exc:
            errors.append(f"grader hooks: {exc}")
    # Free space as the agent left it (its scratch files count): a full disk is evidence even
    # when the scratch reset below happens to free it.
    st = os.statvfs("/")
    if not survivors:
        import grading_scratch  # (only graders pay its import, not the supervisor's start-up)

        keep = list(header.get("keep") or ())
        record = bool(header.get("record"))
        try:
            grading_scratch.reset_toolchain(
                list(header.get("toolchain") or ()), keep, record, reset
            )
        except OSError as exc:
            errors.append(f"toolchain config: {exc}")
        try:
            grading_scratch.reset_scratch(list(header.get("scratch") or ()), keep, record, reset)
        except OSError as exc:
            errors.append(f"scratch space: {exc}")
        if header.get("strict"):  # the task's harness_strict: all but its outputs (and /logs)
            import grading_strict

            strict_keep = keep + list(header.get("strict_keep") or ())
            try:
                if record:
                    grading_strict.record(strict_keep, errors)
                else:
                    grading_strict.restore(strict_keep, reset, errors)
            except OSError as exc:
                errors.append(f"the image's root (strict mode): {exc}")
    return {
        "killed": killed,
        "survivors": survivors,
        "found": found,
        "errors": errors,
        "reset": reset,
        "free_bytes": st.f_bavail * st.f_frsize,
        "free_inodes": st.f_favail if st.f_files else -1,
    }


def _maybe_finish(ex, now):
    if ex.finished or ex.rc is None:
        return
    if ex.pipes and now - ex.exited_at < _DRAIN_AFTER_EXIT_S:
        return
    for fd in list(ex.pipes):
        _close_fd(fd)
    ex.pipes.clear()
    _exit_frame(ex, ex.rc, ex.timed_out, None)


_reserve = [None]  # an fd held back so that EMFILE in accept can still drain the queue
_relays = set()
_relay_cap = [1024]  # open relays at most (each holds 2 fds); set in main from RLIMIT_NOFILE


def _reserve_fd():
    if _reserve[0] is None:
        try:  # noqa: SIM105 (contextlib costs start-up time here)
            _reserve[0] = os.open("/", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass


def _accept(listener):
    """One connection from the listener's queue, or None (none left, or out of descriptors).

    Out of descriptors (an agent's flood of connections to a forwarded port: issue 29, finding
    3), the pending connection is accepted on the reserved fd and closed at once, so the
    listener's queue drains and the event loop does not spin; pid 1 itself never fails.
    """
    try:
        fd, _ = listener._accept()
    except (BlockingIOError, InterruptedError, ConnectionAbortedError):
        return None
    except OSError as exc:
        if exc.errno not in (23, 24):  # ENFILE, EMFILE
            _log(f"accept failed: {exc}")
            return None
        if _reserve[0] is not None:
            os.close(_reserve[0])
            _reserve[0] = None
            try:  # noqa: SIM105 (contextlib costs start-up time here)
                fd, _ = listener._accept()
                os.close(fd)
            except OSError:
                pass
            _reserve_fd()
        _log("out of file descriptors: a connection was refused")
        return None
    return _socket.socket(fileno=fd)


def _on_accept_ctl(listener):
    conn = _accept(listener)
    if conn is None:
        return
    conn.setblocking(False)
    ex = _Exec(conn)
    _execs.add(ex)
    _register(conn.fileno(), _IN, "conn", ex)


def _on_accept_forward(listener, unix_path):
    client = _accept(listener)
    if client is None:
        return
    if len(_relays) >= _relay_cap[0]:  # refused, not queued: the agent's own calls get through
        client.close()
        return
    upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        upstream.connect(unix_path)
    except OSError as exc:
        _log(f"forward to {unix_path} failed: {exc}")
        client.close()
        upstream.close()
        return
    client.setblocking(False)
    upstream.setblocking(False)
    relay = _Relay(client, upstream)
    _relays.add(relay)
    for s in relay.socks:
        _register(s.fileno(), _IN, "relay", relay)


def _relay_interest(relay):
    for s in relay.socks:
        fd, other = s.fileno(), relay.other(s).fileno()
        events = 0
        if not relay.eof[fd] and len(relay.pending[other]) < _MAX_PENDING:
            events |= _IN
        if relay.pending[fd]:
            events |= _OUT
        if fd in _handlers:
            _modify(fd, events)


def _close_relay(relay):
    if relay.closed:
        return
    relay.closed = True
    _relays.discard(relay)
    for s in relay.socks:
        _unregister(s.fileno())
        s.close()


def _on_relay(relay, fd, events):
    sock = relay.socks[0] if relay.socks[0].fileno() == fd else relay.socks[1]
    other = relay.other(sock)
    try:
        if events & (_IN | _ERR) and not relay.eof[fd]:
            data = sock.recv(_CHUNK)
            if data:
                relay.pending[other.fileno()] += data
            else:
                relay.eof[fd] = True
                if not relay.pending[other.fileno()]:
                    other.shutdown(_socket.SHUT_WR)
        if events & (_OUT | _ERR) and relay.pending[fd]:
            sent = sock.send(relay.pending[fd])
            del relay.pending[fd][:sent]
            if not relay.pending[fd] and relay.eof[other.fileno()]:
                sock.shutdown(_socket.SHUT_WR)
    except BlockingIOError:
        pass
    except OSError:
        _close_relay(relay)
        return
    if all(relay.eof.values()) and not any(relay.pending.values()):
        _close_relay(relay)
        return
    if events & _ERR and relay.eof[fd] and not relay.pending[fd]:
        _unregister(fd)  # this side is dead and owed nothing: stop polling it (HUP is sticky)
    _relay_interest(relay)


def _apply_limits(limits):
    pairs = (
        ("nproc", resource.RLIMIT_NPROC),
        ("fsize", resource.RLIMIT_FSIZE),
        ("nofile", resource.RLIMIT_NOFILE),
        ("core", resource.RLIMIT_CORE),
    )
    for key, which in pairs:
        value = limits.get(key)
        if value is None:
            continue
        _, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def _make_undumpable():
    """PR_SET_DUMPABLE 0: commands run as our uid, and without this they could ptrace us (or
    pidfd_getfd our control socket, or read /proc/1/mem) and forge results. Non-dumpable makes
    those need CAP_SYS_PTRACE, which nothing in the sandbox has. ctypes costs a few ms of
    start-up; no cheaper way to call prctl exists in the standard library."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        _log(f"prctl(PR_SET_DUMPABLE, 0) failed: errno {ctypes.get_errno()}")
        sys.exit(3)


def main():
    config = marshal.loads(bytes.fromhex(sys.argv[1]))
    # First, with the two capabilities bwrap left us (see pid1_setup.py): the host's device
    # nodes read-only, then no capability for us or anything we start, ever.
    try:
        import pid1_setup

        pid1_setup.harden_dev(config.get("dev_nodes") or ())
        pid1_setup.drop_capabilities()
    except OSError as exc:
        _log(f"cannot harden the sandbox: {exc}")
        sys.exit(4)
    # We are the sandbox's pid 1 (bwrap --as-pid-1): the kernel drops signals sent to us from
    # inside the sandbox unless we handle them, so an agent's `kill -9 -1` or `pkill python3`
    # cannot take the sandbox down. SIGINT would raise KeyboardInterrupt: ignore it. SIGCHLD is
    # handled only to wake the loop (set_wakeup_fd) so exited children are reaped at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    _register(wake_r, _IN, "wake", None)
    _apply_limits(config.get("limits") or {})
    soft_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_nofile != resource.RLIM_INFINITY:  # 2 fds a relay, room for commands' pipes
        _relay_cap[0] = max(8, min(_relay_cap[0], (soft_nofile - 256) // 2))
    _reserve_fd()
    ctl_fd = int(config["ctl_fd"])
    # Inherited from the host, so inheritable: a command that inherited it could accept the
    # host's next control connection (the verifier's) and answer it with a forged result.
    os.set_inheritable(ctl_fd, False)
    _make_undumpable()
    ctl = _socket.socket(fileno=ctl_fd)
    ctl.setblocking(False)
    _register(ctl.fileno(), _IN, "ctl", ctl)
    listeners = []
    for port, unix_path in (config.get("forward") or {}).items():
        # 127.0.0.1 always; ::1 too where the namespace has IPv6, since Node resolves
        # "localhost" to ::1 first.
        for family, address, required in (
            (_socket.AF_INET, "127.0.0.1", True),
            (_socket.AF_INET6, "::1", False),
        ):
            listener = _socket.socket(family, _socket.SOCK_STREAM)
            try:
                listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
                listener.bind((address, int(port)))
            except OSError:
                listener.close()
                if required:
                    raise
                continue
            listener.listen(128)
            listener.setblocking(False)
            listeners.append(listener)
            _register(listener.fileno(), _IN, "fwd", (listener, unix_path))
    os.chdir("/")
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        now = time.monotonic()
        timeout = 1.0
        for ex in list(_execs):
            if ex.deadline is not None and ex.rc is None:
                if now >= ex.deadline:
                    ex.timed_out = True
                    ex.deadline = None
                    _kill_group(ex)
                else:
                    timeout = min(timeout, ex.deadline - now)
            if ex.rc is not None and not ex.finished:
                timeout = min(timeout, max(0.0, ex.exited_at + _DRAIN_AFTER_EXIT_S - now))
        try:
            ready = _ep.poll(timeout)
        except InterruptedError:
            ready = []
        for fd, events in ready:
            entry = _handlers.get(fd)
            if entry is None:
                continue  # closed by an earlier event of this batch
            try:
                _dispatch(entry, fd, events, wake_r)
            except Exception as exc:  # noqa: BLE001 - pid 1 must outlive any one connection
                _log(f"{entry[0]} handler failed: {type(exc).__name__}: {exc}")
                _drop(entry)
        _reap()
        now = time.monotonic()
        for ex in list(_execs):
            if not ex.closed:
                _maybe_finish(ex, now)
                if ex.finished and not ex.out:
                    _close_exec(ex)


def _drop(entry):
    """Close what a failed handler was serving (its relay or its command), nothing else."""
    kind, obj = entry
    try:
        if kind == "relay":
            _close_relay(obj)
        elif kind in ("conn", "pipe", "stdin"):
            _close_exec(obj)
    except Exception as exc:  # noqa: BLE001
        _log(f"closing after a failed {kind} handler failed too: {exc}")


def _dispatch(entry, fd, events, wake_r):
    kind, obj = entry
    if kind == "wake":
        try:  # noqa: SIM105 (contextlib costs start-up time here)
            os.read(wake_r, 4096)
        except BlockingIOError:
            pass
    elif kind == "ctl":
        _on_accept_ctl(obj)
    elif kind == "fwd":
        _on_accept_forward(*obj)
    elif kind == "relay":
        if not obj.closed:
            _on_relay(obj, fd, events)
    elif obj.closed:
        return
    elif kind == "conn":
        _on_conn(obj, events)
    elif kind == "pipe":
        _on_pipe(obj, fd)
    elif kind == "stdin":
        _on_stdin(obj)


if __name__ == "__main__":
    main()
