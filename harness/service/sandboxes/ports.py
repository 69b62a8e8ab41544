"""Which host TCP endpoints a local sandbox may reach, and the URLs an agent uses for them inside.

A forward is `{sandbox loopback port: (host, port)}`. The usual one is the capture proxy at the
same port number, so the proxy URL only changes its host to 127.0.0.1:

    url_forward("http://127.0.0.1:41234/s/ab12/v1")  -> {41234: ("127.0.0.1", 41234)}
    sandbox_url("http://127.0.0.1:41234/s/ab12/v1")  -> "http://127.0.0.1:41234/s/ab12/v1"
    sandbox_url("http://10.0.0.5:41234/s/ab12/v1")   -> "http://127.0.0.1:41234/s/ab12/v1"

Only http(s) URLs with an explicit or default port are accepted; anything else is refused with
a message, never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["parse_forward", "sandbox_url", "url_forward"]


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"cannot forward {url!r}: expected an http(s)://host:port URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname, port


def url_forward(url: str) -> dict[int, tuple[str, int]]:
    """The forward that makes `sandbox_url(url)` reach `url`'s server from inside."""
    host, port = _host_port(url)
    return {port: (host, port)}


def sandbox_url(url: str) -> str:
    """`url` as seen from inside a local sandbox forwarding its port (host -> 127.0.0.1)."""
    _, port = _host_port(url)
    parts = urlsplit(url)
    netloc = f"127.0.0.1:{port}"
    if parts.username:
        netloc = f"{parts.username}{':' + parts.password if parts.password else ''}@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def parse_forward(forward: Mapping[int | str, Any]) -> dict[int, tuple[str, int]]:
    """Accept {port: (host, port)}, {port: [host, port]}, {port: "host:port"} or {port: port}."""
    out: dict[int, tuple[str, int]] = {}
    for key, value in forward.items():
        if isinstance(value, int):
            target = ("127.0.0.1", value)
        elif isinstance(value, str):
            host, _, port = value.rpartition(":")
            target = (host or "127.0.0.1", int(port))
        else:
            host, port = value
            target = (str(host), int(port))
        out[int(key)] = target
    return out
