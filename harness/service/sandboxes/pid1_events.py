"""Pid 1's event loop registry: one epoll, and who handles each descriptor (run by pid 1).

Runs inside the sandbox, imported by supervisor.py and relays.py at the supervisor's start (the
standard library only, Python >= 3.9; `select` only, for start-up time: see supervisor.py).
Both register descriptors here and the supervisor's loop dispatches on `_handlers[fd]`'s kind.
"""

import select
import sys

_CHUNK = 65536
_IN, _OUT = select.EPOLLIN, select.EPOLLOUT
_ERR = select.EPOLLHUP | select.EPOLLERR

_ep = select.epoll()
_handlers = {}  # fd -> (kind, object)


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
