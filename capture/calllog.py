"""A session's on-disk call log: append-only JSON lines, written durably by a stated policy.

Durability: every line is handed to the kernel with one `os.write` on an `O_APPEND` descriptor
the moment its call completes, so a proxy that crashes or is killed loses nothing it recorded
(the page cache outlives the process). What `fsync` adds is surviving the MACHINE: power loss or
a kernel panic. Policies (`--fsync` / `CaptureServer(fsync=...)`):

    "interval"  (default) every log written since the last pass is fsynced every `interval_s`
                (1 s) from a worker thread, off the event loop; a machine crash loses at most that
                last interval of calls
    "call"      fsync after every line, on the event loop, before the next request is handled;
                a machine crash loses nothing that was answered (cost: bench/capture/durability.py)
    "never"     the kernel writes back when it likes (~30 s on Linux); for tests and scratch runs

Node-id reservations (`reserve` lines, `capture.sessions`) are fsynced under "interval" and
"call" whatever the interval, so an id handed out is never handed out again after any crash.

Reading (`read_records`): one line is one record; a line that does not parse (torn by a crash
mid-write, or corrupted) is counted and skipped, and costs that line alone: the lines after it
are read as usual (what a lost call line means for the calls that continued it is
`capture.sessions`' concern). A log whose last line has no newline (a crash mid-write) gets one
before anything is appended, so the next record never fuses with the torn bytes.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .upstream import JSON_ERRORS, dumps, loads

__all__ = ["FSYNC_POLICIES", "CallLog", "read_records", "sync_fds"]

logger = logging.getLogger(__name__)

FSYNC_POLICIES = ("interval", "call", "never")


class CallLog:
    """One session's `calls.jsonl`, open for appending while the session lives."""

    __slots__ = ("_fd", "dirty", "failed_writes", "path", "policy")

    def __init__(self, path: Path, policy: str = "interval") -> None:
        if policy not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, got {policy!r}")
        self.path, self.policy = path, policy
        self.dirty = False  # written since the last fsync
        self.failed_writes = 0
        self._fd: int | None = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            size = os.fstat(self._fd).st_size
            if size:  # a torn last line (a crash mid-write) is closed, never continued
                with open(self.path, "rb") as handle:
                    handle.seek(size - 1)
                    if handle.read(1) != b"\n":
                        os.write(self._fd, b"\n")
        return self._fd

    def append(self, record: dict[str, Any], *, durable: bool = False) -> None:
        """Write one record as one line; fsync it now under the "call" policy (or `durable`,
        unless the policy is "never"). A write error (a full disk) is logged loudly and counted,
        never raised: the agent's call was answered already."""
        data = dumps(record) + b"\n"
        try:
            fd = self._open()
            view = memoryview(data)
            while view:  # a regular file takes it whole, short of a full disk
                view = view[os.write(fd, view):]
            if self.policy == "call" or (durable and self.policy != "never"):
                os.fsync(fd)
            else:
                self.dirty = True
        except OSError as exc:
            self.failed_writes += 1
            logger.error("could not append to %s: %s", self.path, exc)

    def dup_if_dirty(self) -> int | None:
        """A duplicate descriptor to fsync from another thread (closing it there), or None if
        nothing was written since the last sync. The duplicate keeps the file open even if the
        session is deleted meanwhile."""
        if not self.dirty or self._fd is None:
            return None
        self.dirty = False
        return os.dup(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if self.dirty and self.policy != "never":
                    os.fsync(fd)
            finally:
                os.close(fd)


def sync_fds(fds: list[int]) -> None:
    """fsync and close duplicated descriptors (run in a worker thread)."""
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as exc:
            logger.error("fsync of a session log failed: %s", exc)
        finally:
            os.close(fd)


def read_records(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Every parseable record of a log, in order, and how many lines did not parse."""
    records: list[dict[str, Any]] = []
    torn = 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            record = loads(line)
        except JSON_ERRORS:
            record = None
        if isinstance(record, dict):
            records.append(record)
        else:
            torn += 1
    return records, torn
