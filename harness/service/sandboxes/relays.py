"""Port forwarding inside the sandbox: 127.0.0.1:PORT relayed to a host unix socket (run by pid 1).

Runs inside the sandbox, imported by supervisor.py at its start (the standard library only,
Python >= 3.9). For each configured port pid 1 listens on 127.0.0.1 (and ::1) inside the
sandbox's own network namespace and relays every connection to a unix socket bound in from the
host, where the host relays it on to the capture proxy (supervisor.py's docstring). A flood of
connections meets `_relay_cap` and, out of descriptors, a reserved fd that lets accept drain the
queue (issue 29, finding 3): pid 1 itself never fails.
"""

import _socket
import os
import resource

from pid1_events import _CHUNK, _ERR, _IN, _OUT, _handlers, _log, _modify, _register, _unregister

_MAX_PENDING = 8 * 1024 * 1024  # stop reading a relay side while this much is unsent


class _Relay:
    """One forwarded connection: two sockets and the bytes waiting to go each way."""

    def __init__(self, a, b):
        self.socks = (a, b)
        self.pending = {a.fileno(): bytearray(), b.fileno(): bytearray()}  # bytes to send *to* fd
        self.eof = {a.fileno(): False, b.fileno(): False}  # fd has sent EOF
        self.closed = False

    def other(self, sock):
        return self.socks[1] if sock is self.socks[0] else self.socks[0]


_reserve = [None]  # an fd held back so that EMFILE in accept can still drain the queue
_relays = set()
_relay_cap = [1024]  # open relays at most (each holds 2 fds); set by prepare_relays from RLIMIT_NOFILE


def _reserve_fd():
    if _reserve[0] is None:
        try:  # noqa: SIM105 (contextlib costs start-up time here)
            _reserve[0] = os.open("/", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            pass


def accept(listener):
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


def prepare_relays():
    """At start, after the limits are set: the relay cap from RLIMIT_NOFILE, the reserved fd."""
    soft_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_nofile != resource.RLIM_INFINITY:  # 2 fds a relay, room for commands' pipes
        _relay_cap[0] = max(8, min(_relay_cap[0], (soft_nofile - 256) // 2))
    _reserve_fd()


def listen_forwarded(forward):
    """Listen on each forwarded port ({port: host unix socket path}); the loop accepts ("fwd")."""
    for port, unix_path in forward.items():
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
            _register(listener.fileno(), _IN, "fwd", (listener, unix_path))


def on_accept_forward(listener, unix_path):
    client = accept(listener)
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


def close_relay(relay):
    if relay.closed:
        return
    relay.closed = True
    _relays.discard(relay)
    for s in relay.socks:
        _unregister(s.fileno())
        s.close()


def on_relay(relay, fd, events):
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
        close_relay(relay)
        return
    if all(relay.eof.values()) and not any(relay.pending.values()):
        close_relay(relay)
        return
    if events & _ERR and relay.eof[fd] and not relay.pending[fd]:
        _unregister(fd)  # this side is dead and owed nothing: stop polling it (HUP is sticky)
    _relay_interest(relay)
