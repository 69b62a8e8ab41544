"""Host side of the two channels into a local sandbox: commands, and forwarded ports.

Commands: `run_command()` opens one connection to the supervisor's control socket per command
and speaks the framing documented in `supervisor.py` (marshal, not JSON: the
supervisor avoids importing `json` to start faster). Closing the connection early (the calling
task was cancelled) makes the supervisor kill the command's process group, so cancellation
never leaves a command running.

Ports: `PortForwarder` is one daemon thread with its own asyncio loop, shared by every sandbox of
the process. For each forwarded port a sandbox gets a unix socket in its host-only `net/` dir
(bound read-only into the sandbox at /run/harness); the in-sandbox supervisor relays
127.0.0.1:PORT to it, and this thread relays it to the real TCP address. Why a thread of its own:
sessions may drive sandboxes from different event loops (or from sync code through
`asyncio.run`), and a relay tied to one caller's loop would die with it.
"""

from __future__ import annotations

import asyncio
import marshal
import struct
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from harness.service.sandboxes.errors import SandboxExecError

__all__ = ["PortForwarder", "RawExecResult", "run_command"]

_FRAME = struct.Struct(">cI")
OutputSink = Callable[[bytes, str], Awaitable[None]]


@dataclass
class RawExecResult:
    """A finished command: raw bytes, its exit code, whether the supervisor killed it late."""

    stdout: bytes
    stderr: bytes
    return_code: int
    timed_out: bool
    error: str | None = None


async def run_command(
    ctl_path: Path,
    argv: list[str],
    *,
    env: dict[str, str],
    cwd: str,
    timeout_s: float | None,
    stdin: bytes = b"",
    on_output: OutputSink | None = None,
    op: str | None = None,
    op_args: dict[str, object] | None = None,
) -> RawExecResult:
    """Run argv in the sandbox and wait for it; raises SandboxExecError if the channel breaks.

    `op="killall"` / `op="grading_reset"` (with `op_args`) send one of the supervisor's own
    requests instead of a command; its answer is a marshal dict in `stdout`.
    """
    try:
        reader, writer = await asyncio.open_unix_connection(str(ctl_path))
    except OSError as exc:
        raise SandboxExecError(
            f"cannot reach the sandbox supervisor at {ctl_path}: {exc} (was the sandbox stopped?)"
        ) from exc
    request = {"argv": argv, "env": env, "cwd": cwd, "timeout": timeout_s, "stdin_len": len(stdin)}
    if op is not None:
        request = {**(op_args or {}), "op": op}
    # marshal version 4: a format every Python >= 3.4 reads (the supervisor runs on the host's
    # own python3, whatever version that is).
    header = marshal.dumps(request, 4)
    out, err = bytearray(), bytearray()
    try:
        # Never half-close: the supervisor reads EOF on this socket as "kill the command".
        writer.write(struct.pack(">I", len(header)) + header + stdin)
        await writer.drain()
        while True:
            kind, length = _FRAME.unpack(await reader.readexactly(_FRAME.size))
            payload = await reader.readexactly(length)
            if kind == b"x":
                status = marshal.loads(payload)
                return RawExecResult(
                    bytes(out),
                    bytes(err),
                    int(status["rc"]),
                    bool(status["timed_out"]),
                    status.get("error"),
                )
            (out if kind == b"o" else err).extend(payload)
            if on_output is not None:
                await on_output(payload, "stdout" if kind == b"o" else "stderr")
    except (asyncio.IncompleteReadError, ConnectionError) as exc:
        raise SandboxExecError(
            f"the sandbox closed the command channel before {argv[:3]!r} finished "
            "(the sandbox was stopped or its supervisor died; see its log)"
        ) from exc
    finally:
        writer.close()


class PortForwarder:
    """Relays unix sockets (reachable inside sandboxes) to host TCP addresses, in one thread."""

    _instance: PortForwarder | None = None
    _instance_lock = threading.Lock()

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="harness-port-forwarder", daemon=True
        )
        self._thread.start()
        # sandbox key -> (servers, live relay writers)
        self._owned: dict[str, tuple[list[asyncio.AbstractServer], set[asyncio.StreamWriter]]] = {}

    @classmethod
    def shared(cls) -> PortForwarder:
        with cls._instance_lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def open(self, key: str, net_dir: Path, forward: dict[int, tuple[str, int]]) -> None:
        """Create net_dir/PORT.sock for each port, relaying to its (host, port)."""
        fut = asyncio.run_coroutine_threadsafe(self._open(key, net_dir, forward), self._loop)
        fut.result(timeout=10)

    def close(self, key: str) -> None:
        """Stop listening for this sandbox and cut its live connections."""
        fut = asyncio.run_coroutine_threadsafe(self._close(key), self._loop)
        fut.result(timeout=10)

    async def _open(self, key: str, net_dir: Path, forward: dict[int, tuple[str, int]]) -> None:
        servers: list[asyncio.AbstractServer] = []
        writers: set[asyncio.StreamWriter] = set()
        self._owned[key] = (servers, writers)
        for port, (host, target_port) in forward.items():
            handler = self._handler(host, target_port, writers)
            path = net_dir / f"{port}.sock"
            servers.append(await asyncio.start_unix_server(handler, path=str(path)))

    async def _close(self, key: str) -> None:
        servers, writers = self._owned.pop(key, ([], set()))
        for server in servers:
            server.close()
        for writer in list(writers):
            writer.close()
        for server in servers:
            await server.wait_closed()

    @staticmethod
    def _handler(host: str, port: int, writers: set[asyncio.StreamWriter]):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writers.add(writer)
            try:
                up_reader, up_writer = await asyncio.open_connection(host, port)
            except OSError:
                writers.discard(writer)
                writer.close()
                return
            writers.add(up_writer)

            async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                    if dst.can_write_eof():
                        dst.write_eof()
                except (ConnectionError, OSError):
                    dst.close()

            try:
                await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
            finally:
                for w in (writer, up_writer):
                    writers.discard(w)
                    w.close()

        return handle
