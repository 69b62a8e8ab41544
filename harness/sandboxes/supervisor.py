"""The process that lives inside a local sandbox: runs commands and forwards proxy ports.

This file runs *inside* the bubblewrap sandbox, under the host's /usr/bin/python3 (whatever
version that is, >= 3.9), so it imports nothing but the standard library and nothing from Harness.
The host starts it as the sandbox's only process and talks to it over one listening unix socket
whose file descriptor it inherits (the socket's path lives in a host directory the sandbox cannot
see, so nothing inside the sandbox can open a second control connection).

Why a resident process instead of one `bwrap` per command: Harbor's environments keep state
between `exec` calls (background servers, the network namespace), and a fresh namespace per
command would lose them and pay the namespace set-up each time.

Control protocol, one connection per command:
    host -> supervisor   one JSON line {"argv", "env", "cwd", "timeout", "stdin_len"}, then
                         `stdin_len` raw bytes for the command's stdin
    supervisor -> host   frames: 1 type byte + 4-byte big-endian length + payload
                         b"o" stdout bytes, b"e" stderr bytes,
                         b"x" JSON {"rc": int, "timed_out": bool, "error": str | None} (last)
If the host closes the connection before the exit frame, the command's whole process group is
killed: that is how a cancelled `exec` on the host cleans up after itself.

Port forwarding: for each configured port the supervisor listens on 127.0.0.1:PORT inside the
sandbox's own network namespace (which has nothing but loopback) and relays every connection to
a unix socket bound in from the host, where the host relays it on to the real TCP address (the
capture proxy). Nothing else on the host is reachable.

Limits set here are inherited by every command: RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_NOFILE, no
core dumps. A command past its deadline has its process group SIGKILLed.

It refuses to do anything else: no file transfer primitives (the host streams tar through `exec`,
so every path is resolved inside the sandbox's view and an agent's symlink cannot point a host
write at a host file), no shell of its own, no retries.
"""

import contextlib
import json
import os
import resource
import selectors
import signal
import socket
import struct
import sys
import time

_CHUNK = 65536
_MAX_PENDING = 8 * 1024 * 1024  # stop reading a command's output while this much is unsent
_DRAIN_AFTER_EXIT_S = 0.2  # background children may hold stdout open; do not wait for them

_sel = selectors.DefaultSelector()


def _log(message):
    sys.stderr.write(f"[supervisor] {message}\n")
    sys.stderr.flush()


class _Exec:
    """One command: its connection to the host, its pipes, its process."""

    def __init__(self, conn):
        self.conn = conn
        self.inbuf = b""
        self.header = None
        self.stdin_data = b""
        self.out = bytearray()
        self.pid = None
        self.pidfd = None
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
        self.pending = {a: bytearray(), b: bytearray()}  # bytes waiting to be sent *to* sock
        self.eof = {a: False, b: False}  # sock has sent EOF
        self.closed = False


_execs = set()


def _frame(kind, payload):
    return kind + struct.pack(">I", len(payload)) + payload


def _update_conn_interest(ex):
    events = selectors.EVENT_READ
    if ex.out:
        events |= selectors.EVENT_WRITE
    _sel.modify(ex.conn, events, ("conn", ex))


def _send(ex, kind, payload):
    ex.out += _frame(kind, payload)
    if not ex.closed:
        _update_conn_interest(ex)


def _kill_group(ex):
    if ex.pid is not None and ex.rc is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ex.pid, signal.SIGKILL)


def _close_exec(ex):
    if ex.closed:
        return
    ex.closed = True
    if ex.rc is None:
        _kill_group(ex)
    for fd in list(ex.pipes):
        _unregister_fd(fd)
        os.close(fd)
    ex.pipes.clear()
    if ex.stdin_fd is not None:
        _unregister_fd(ex.stdin_fd)
        os.close(ex.stdin_fd)
        ex.stdin_fd = None
    if ex.pidfd is not None:
        _unregister_fd(ex.pidfd)
        os.close(ex.pidfd)
        ex.pidfd = None
    if ex.pid is not None and ex.rc is None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(ex.pid, 0)
    with contextlib.suppress(KeyError, ValueError):
        _sel.unregister(ex.conn)
    ex.conn.close()
    _execs.discard(ex)


def _unregister_fd(fd):
    with contextlib.suppress(KeyError, ValueError):
        _sel.unregister(fd)


def _spawn(ex):
    header = ex.header
    argv = header["argv"]
    env = header.get("env") or {}
    cwd = header.get("cwd") or "/"
    timeout = header.get("timeout")
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    in_r, in_w = os.pipe()
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
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            os.close(fd)
        msg = f"cannot enter working directory {cwd!r}: {exc.strerror}"
        _send(ex, b"x", json.dumps({"rc": 126, "timed_out": False, "error": msg}).encode())
        ex.finished = True
        return
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
        for fd in (out_r, out_w, err_r, err_w, in_r, in_w):
            os.close(fd)
        msg = f"cannot start {argv[0]!r}: {exc.strerror}"
        _send(ex, b"x", json.dumps({"rc": 127, "timed_out": False, "error": msg}).encode())
        ex.finished = True
        return
    finally:
        os.chdir("/")
    for fd in (out_w, err_w, in_r):
        os.close(fd)
    ex.pid = pid
    ex.pidfd = os.pidfd_open(pid)
    _sel.register(ex.pidfd, selectors.EVENT_READ, ("pid", ex))
    for fd, kind in ((out_r, b"o"), (err_r, b"e")):
        os.set_blocking(fd, False)
        ex.pipes[fd] = kind
        _sel.register(fd, selectors.EVENT_READ, ("pipe", ex))
    if ex.stdin_data:
        os.set_blocking(in_w, False)
        ex.stdin_fd = in_w
        _sel.register(in_w, selectors.EVENT_WRITE, ("stdin", ex))
    else:
        os.close(in_w)
    if timeout:
        ex.deadline = time.monotonic() + float(timeout)


def _on_conn(ex, mask):
    if mask & selectors.EVENT_WRITE and ex.out:
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
        _update_conn_interest(ex)
    if mask & selectors.EVENT_READ:
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
        if ex.header is None:
            ex.inbuf += data
            if b"\n" not in ex.inbuf:
                return
            line, rest = ex.inbuf.split(b"\n", 1)
            ex.header = json.loads(line)
            ex.inbuf = rest
        else:
            ex.inbuf += data
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
        _unregister_fd(ex.stdin_fd)
        os.close(ex.stdin_fd)
        ex.stdin_fd = None


def _on_pipe(ex, fd):
    try:
        data = os.read(fd, _CHUNK)
    except BlockingIOError:
        return
    if data:
        _send(ex, ex.pipes[fd], data)
        return
    _unregister_fd(fd)
    os.close(fd)
    del ex.pipes[fd]


def _on_pid(ex):
    _, status = os.waitpid(ex.pid, 0)
    if os.WIFEXITED(status):
        ex.rc = os.WEXITSTATUS(status)
    else:
        ex.rc = 128 + os.WTERMSIG(status)
    _unregister_fd(ex.pidfd)
    os.close(ex.pidfd)
    ex.pidfd = None
    ex.exited_at = time.monotonic()


def _maybe_finish(ex, now):
    if ex.finished or ex.rc is None:
        return
    if ex.pipes and now - ex.exited_at < _DRAIN_AFTER_EXIT_S:
        return
    for fd in list(ex.pipes):
        _unregister_fd(fd)
        os.close(fd)
    ex.pipes.clear()
    ex.finished = True
    _send(ex, b"x", json.dumps({"rc": ex.rc, "timed_out": ex.timed_out, "error": None}).encode())


def _on_accept_ctl(sock):
    conn, _ = sock.accept()
    conn.setblocking(False)
    ex = _Exec(conn)
    _execs.add(ex)
    _sel.register(conn, selectors.EVENT_READ, ("conn", ex))


def _on_accept_forward(sock, unix_path):
    client, _ = sock.accept()
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
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
    for s in relay.socks:
        _sel.register(s, selectors.EVENT_READ, ("relay", relay))


def _relay_interest(relay):
    for s in relay.socks:
        other = relay.socks[1] if s is relay.socks[0] else relay.socks[0]
        events = 0
        if not relay.eof[s] and len(relay.pending[other]) < _MAX_PENDING:
            events |= selectors.EVENT_READ
        if relay.pending[s]:
            events |= selectors.EVENT_WRITE
        try:
            if events:
                _sel.modify(s, events, ("relay", relay))
            else:
                _sel.unregister(s)
        except KeyError:
            if events:
                _sel.register(s, events, ("relay", relay))


def _close_relay(relay):
    if relay.closed:
        return
    relay.closed = True
    for s in relay.socks:
        with contextlib.suppress(KeyError, ValueError):
            _sel.unregister(s)
        s.close()


def _on_relay(relay, sock, mask):
    other = relay.socks[1] if sock is relay.socks[0] else relay.socks[0]
    try:
        if mask & selectors.EVENT_READ:
            data = sock.recv(_CHUNK)
            if data:
                relay.pending[other] += data
            else:
                relay.eof[sock] = True
                if not relay.pending[other]:
                    other.shutdown(socket.SHUT_WR)
        if mask & selectors.EVENT_WRITE and relay.pending[sock]:
            sent = sock.send(relay.pending[sock])
            del relay.pending[sock][:sent]
            if not relay.pending[sock] and relay.eof[other]:
                sock.shutdown(socket.SHUT_WR)
    except BlockingIOError:
        pass
    except OSError:
        _close_relay(relay)
        return
    if all(relay.eof.values()) and not any(relay.pending.values()):
        _close_relay(relay)
        return
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
        soft, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


def main():
    config = json.loads(sys.argv[1])
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _apply_limits(config.get("limits") or {})
    ctl = socket.socket(fileno=int(config["ctl_fd"]))
    ctl.setblocking(False)
    _sel.register(ctl, selectors.EVENT_READ, ("ctl", None))
    for port, unix_path in (config.get("forward") or {}).items():
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", int(port)))
        listener.listen(128)
        listener.setblocking(False)
        _sel.register(listener, selectors.EVENT_READ, ("fwd", unix_path))
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
        for key, mask in _sel.select(timeout):
            kind, obj = key.data
            if kind == "ctl":
                _on_accept_ctl(key.fileobj)
            elif kind == "fwd":
                _on_accept_forward(key.fileobj, obj)
            elif kind == "relay":
                if not obj.closed:
                    _on_relay(obj, key.fileobj, mask)
            elif obj.closed:
                continue
            elif kind == "conn":
                _on_conn(obj, mask)
            elif kind == "pipe":
                _on_pipe(obj, key.fd)
            elif kind == "stdin":
                _on_stdin(obj)
            elif kind == "pid":
                _on_pid(obj)
        now = time.monotonic()
        for ex in list(_execs):
            if not ex.closed:
                _maybe_finish(ex, now)
                if ex.finished and not ex.out:
                    _close_exec(ex)


if __name__ == "__main__":
    main()
