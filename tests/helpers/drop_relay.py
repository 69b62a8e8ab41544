"""`DropRelay`: a TCP relay in front of a server that breaks the connections of chosen requests.

Why it exists: a connection can break under a request in two ways that a client must tell
apart, and tests need each on cue. Broken before the request reached the server (the race of
a request sent on a keep-alive connection the server is closing): nothing ran. Broken after
(the server did the work, its answer was lost on the way): something ran, and a request sent
again must not run it twice. A real server behind this relay does the work; the relay only
decides which answers arrive.

One request per connection: the relay reads a request, forwards it with `Connection: close`
on a fresh connection to the server, and relays the answer, whose server then closes. A `Break`
matches a request by method and path (a regular expression matched from the path's start), and
its n-th match is broken:
- when="before": the connection closes with the request unsent;
- when="after": the request is sent, and the connection closes without its answer;
- when="done": as "after", on the first matching answer that carries `"done":true`;
with a FIN (how="fin": httpx reads a RemoteProtocolError) or a reset (how="rst": ReadError).
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from dataclasses import dataclass

__all__ = ["Break", "DropRelay"]


@dataclass
class Break:
    method: str
    path: str  # a regular expression, matched from the path's start (re.match)
    nth: int = 1  # the n-th request that matches (for "done": the first done answer from it)
    when: str = "before"  # "before" | "after" | "done"
    how: str = "fin"  # "fin" | "rst"
    seen: int = 0
    done: bool = False


def _read_head(conn: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return b"", b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _close(conn: socket.socket, how: str) -> None:
    if how == "rst":  # SO_LINGER 0: close() sends a reset
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class DropRelay:
    """Relays 127.0.0.1:port -> `upstream` (host, port); `broken` lists what it broke."""

    def __init__(self, upstream: tuple[str, int], breaks: list[Break]) -> None:
        self.upstream = upstream
        self.breaks = breaks
        self.broken: list[tuple[str, str, str]] = []  # (method, path, when) of each break
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _match(self, method: str, path: str) -> Break | None:
        with self._lock:
            self.requests.append((method, path))
            for b in self.breaks:
                if b.done or b.method != method or not re.match(b.path, path):
                    continue
                b.seen += 1
                if b.seen >= b.nth:
                    if b.when != "done":
                        b.done = True
                    return b
        return None

    def _serve(self, conn: socket.socket) -> None:
        try:
            head, body = _read_head(conn)
            if not head:
                conn.close()
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = [h for h in lines[1:] if not h.lower().startswith("connection:")]
            length = next((int(h.split(":", 1)[1]) for h in headers
                           if h.lower().startswith("content-length:")), 0)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    conn.close()
                    return
                body += chunk
            rule = self._match(method, path)
            if rule is not None and rule.when == "before":
                self._broke(rule, method, path)
                _close(conn, rule.how)
                return
            request = "\r\n".join([lines[0], *headers, "Connection: close"]).encode("latin-1")
            with socket.create_connection(self.upstream, timeout=120) as up:
                up.sendall(request + b"\r\n\r\n" + body)
                answer = b""
                while chunk := up.recv(65536):
                    answer += chunk
            if rule is not None and (rule.when == "after"
                                     or (rule.when == "done" and b'"done":true' in answer)):
                rule.done = True
                self._broke(rule, method, path)
                _close(conn, rule.how)
                return
            conn.sendall(answer)
            conn.close()
        except OSError:
            conn.close()

    def _broke(self, rule: Break, method: str, path: str) -> None:
        with self._lock:
            self.broken.append((method, path.split("?")[0], rule.when))
