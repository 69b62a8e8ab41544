"""Two facts about this host's network that every process asks: is an address loopback, and a
port that is free now.

Stdlib only and importing nothing of the project, so that each side may use it: the capture
proxy (whether its admin routes get their own listener), the engine launcher (it refuses a public
host), and the trainer's weight sync, which runs in the trainer and inside vLLM's workers and
must not import harness or capture (tests/test_trainer_isolation.py). These were three copies.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["free_port", "is_loopback"]


def is_loopback(host: str) -> bool:
    """True for "localhost" and loopback addresses; a name other than localhost is assumed to
    reach beyond this host (False)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
