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
grading path a fresh real directory (see `_grading_reset` and grading_reset.py). Commands:
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
capture proxy). Nothing else on the host is reachable. The relays are in relays.py, the epoll
registry both use in pid1_events.py; a command's spawn, pipes and exit frame in pid1_commands.py
(this file reads the control header and runs the loop).

Limits set here are inherited by every command: RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no
core dumps. A command past its deadline has its process group SIGKILLed.

Before anything else it remounts the host's device nodes read-only and drops its capabilities
for good (pid1_setup.py). The grading reset's file work is in grading_reset.py, its scratch and
toolchain parts in grading_scratch.py, strict mode's in grading_strict.py (imported only then). It must outlive anything the agent does: a connection
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
import signal
import struct
import sys
import time

from pid1_commands import (
    _DRAIN_AFTER_EXIT_S,
    _by_pid,
    _close_exec,
    _Exec,
    _execs,
    _exit_frame,
    _kill_group,
    _maybe_finish,
    _on_pipe,
    _on_stdin,
    _reap,
    _send,
    _spawn,
)
from pid1_events import (
    _CHUNK,
    _ERR,
    _IN,
    _OUT,
    _ep,
    _handlers,
    _log,
    _modify,
    _register,
)
from relays import (
    accept,
    close_relay,
    listen_forwarded,
    on_accept_forward,
    on_relay,
    prepare_relays,
)


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


def _grading_reset(header):
    """Before grading: no process of the agent alive (here, pid 1's job), then the grading
    dirs made fresh and what was found reported (grading_reset.py; the answer's keys are
    described there)."""
    killed, survivors = _killall(float(header.get("timeout") or 10.0))
    import grading_reset  # (only graders pay its import, not the supervisor's start-up)

    return grading_reset.reset_for_grading(header, killed, survivors)


def _on_accept_ctl(listener):
    conn = accept(listener)
    if conn is None:
        return
    conn.setblocking(False)
    ex = _Exec(conn)
    _execs.add(ex)
    _register(conn.fileno(), _IN, "conn", ex)


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
    prepare_relays()
    ctl_fd = int(config["ctl_fd"])
    # Inherited from the host, so inheritable: a command that inherited it could accept the
    # host's next control connection (the verifier's) and answer it with a forged result.
    os.set_inheritable(ctl_fd, False)
    _make_undumpable()
    ctl = _socket.socket(fileno=ctl_fd)
    ctl.setblocking(False)
    _register(ctl.fileno(), _IN, "ctl", ctl)
    listen_forwarded(config.get("forward") or {})
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
            close_relay(obj)
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
        on_accept_forward(*obj)
    elif kind == "relay":
        if not obj.closed:
            on_relay(obj, fd, events)
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
