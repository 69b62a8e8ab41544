"""A sandbox's files, moved through its own commands (`exec`), never through host paths.

Every path is resolved inside the sandbox's view by the sandbox's own `sh`, `cat` and `tar`, so an
agent's symlink cannot point a host write at a host file (supervisor.py has no file transfer
primitive for that reason). local.py's `BwrapSandbox` gets these from `FilesThroughExec`.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Awaitable, Callable
from pathlib import Path

from harness.service.sandboxes.channel import RawExecResult
from harness.service.sandboxes.errors import SandboxPathError

__all__ = ["FilesThroughExec"]


class FilesThroughExec:
    """put_file, put_dir, get_file, get_dir for a class with `exec(argv, stdin=, cwd=,
    timeout_s=)` (BwrapSandbox's)."""

    exec: Callable[..., Awaitable[RawExecResult]]  # the sandbox class's own

    async def put_file(self, data: bytes, target: str) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'
        await self._checked(["/bin/sh", "-c", script, "sh", target], stdin=data, what=target)

    async def put_dir(self, source: Path, target: str) -> None:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for child in sorted(Path(source).iterdir()):
                tar.add(child, arcname=child.name)
        script = 'mkdir -p -- "$1" && tar -x --no-same-owner -f - -C "$1"'
        await self._checked(
            ["/bin/sh", "-c", script, "sh", target], stdin=buf.getvalue(), what=target
        )

    async def get_file(self, source: str) -> bytes:
        return (await self._checked(["cat", "--", source], what=source)).stdout

    async def get_dir(self, source: str, target: Path) -> None:
        result = await self._checked(["tar", "-c", "-f", "-", "-C", source, "."], what=source)
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(result.stdout), mode="r:") as tar:
            tar.extractall(target, filter=_safe_member)

    async def _checked(self, argv: list[str], *, what: str, stdin: bytes = b"") -> RawExecResult:
        result = await self.exec(argv, stdin=stdin, cwd="/", timeout_s=600)
        if result.return_code != 0:
            raise SandboxPathError(
                f"{argv[0]} on sandbox path {what} failed (exit {result.return_code}): "
                f"{result.stderr.decode(errors='replace').strip()[:500]}"
            )
        return result


def _safe_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
    """tarfile's data filter, skipping device nodes and FIFOs (they carry no content)."""
    if member.isdev():
        return None
    return tarfile.data_filter(member, dest)
