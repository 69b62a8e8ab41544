"""Tests that must not reach the network: every connection attempt fails, and is recorded."""

from __future__ import annotations

import socket
from typing import Any

import pytest

__all__ = ["NetworkBlocked", "block_network"]


class NetworkBlocked(ConnectionRefusedError):
    """What a test without network gets for any name lookup or connection."""


def block_network(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every name lookup and connection in this process fail with `NetworkBlocked` (a
    ConnectionRefusedError, what a closed port gives) for the rest of the test; returns the
    list the attempts are appended to, so a test can show the code tried and was refused."""
    attempts: list[str] = []

    def refuse(what: str) -> NetworkBlocked:
        attempts.append(what)
        return NetworkBlocked(f"network blocked in this test: {what}")

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        raise refuse(f"getaddrinfo {host}:{port}")

    def connect(self: socket.socket, address: Any) -> None:
        raise refuse(f"connect {address}")

    def connect_ex(self: socket.socket, address: Any) -> int:
        raise refuse(f"connect_ex {address}")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    return attempts
