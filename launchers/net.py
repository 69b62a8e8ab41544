"""Facts about this host's network that every process asks: is an address loopback, a port that
is free now, and which of this host's addresses another host reaches it by.

Stdlib only and importing nothing of the project, so that each side may use it: the capture
proxy (whether its admin routes get their own listener), the engine launcher (it refuses a public
host), and the trainer's weight sync, which runs in the trainer and inside vLLM's workers and
must not import harness or capture (tests/test_trainer_isolation.py). These were three copies.
"""

from __future__ import annotations

import ipaddress
import socket

__all__ = ["address_toward", "free_port", "is_loopback"]


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


def address_toward(host: str, port: int = 9) -> str:
    """This host's own address on the route to `host`: the one a process there can reach us by.

    Why: a rendezvous that advertises 127.0.0.1 (or whatever the hostname resolves to) works on
    one machine and fails across hosts, where the peer must connect back to us (the weight
    sync's transfer group: the trainer hosts it, every engine's workers join it). The kernel's
    routing table knows the answer: "connecting" a UDP socket sends nothing, it only picks the
    source address. A loopback `host` answers 127.0.0.1; an unresolvable one raises OSError.
    """
    if is_loopback(host):
        return "127.0.0.1"
    family, _, _, _, peer = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(peer)
        return sock.getsockname()[0]
