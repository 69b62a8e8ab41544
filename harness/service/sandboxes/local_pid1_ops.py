"""What a local sandbox asks its pid 1 itself, and how the host notices pid 1 dying under a request.

Two requests go to the supervisor rather than through a command (supervisor.py's docstring has
the protocol): `killall` (kill_processes) and `grading_reset` (prepare_grading: between the agent
and the verifier). Every request, commands included, waits through `_unless_pid1_dies`, because
the host holds the control socket's listening end: a request sent to a dead pid 1 is queued, never
refused. local.py's `BwrapSandbox` gets these from `Pid1Requests`, as it gets its file transfers
from local_files.py's `FilesThroughExec`.
"""

from __future__ import annotations

import asyncio
import marshal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from harness.service.sandboxes.channel import run_command
from harness.service.sandboxes.errors import (
    SandboxClosedError,
    SandboxExecError,
    SandboxPathError,
)
from harness.service.sandboxes.grading_state import (
    GRADING_HOME,
    GRADING_HOOKS,
    GRADING_PATHS,
    GRADING_SCRATCH,
    TOOLCHAIN_HOOKS,
    GradingReset,
)
from harness.service.sandboxes.mounts import usr_links

__all__ = ["Pid1Requests"]

# A supervisor op (kill everything, the grading reset) that takes longer than this means pid 1
# is wedged or dying: waiting on forever would hang the grading (issue 29, finding 10).
_OP_TIMEOUT_S = 120.0
# A dead pid 1 whose bwrap has not exited after this long: bwrap itself is wedged; the error is
# then reported as a channel error rather than waited on forever.
_REAP_WAIT_S = 30.0
_PF_EXITING = 0x4  # include/linux/sched.h: set at the start of do_exit()


class Pid1Requests:
    """kill_processes and prepare_grading for a sandbox class with a pid 1 (BwrapSandbox): its
    `name`, private `dir`, bwrap process `_proc`, pid 1's host pid `_child_pid`, `_check_alive()`
    and `_log_tail()`."""

    name: str
    dir: Path | None
    _proc: subprocess.Popen[bytes] | None
    _child_pid: int | None  # the supervisor's host pid (bwrap's --info-fd child-pid)

    _check_alive: Callable[[], None]  # the sandbox class's own
    _log_tail: Callable[[], str]

    async def kill_processes(self) -> int:
        """SIGKILL every process in the sandbox but its supervisor; the sandbox stays usable.

        Returns how many were killed. Raises SandboxExecError if any is still alive after 10 s.
        `prepare_grading()` does this and more: use it between the agent and the verifier.
        """
        answer = await self._supervisor_op("killall", {})
        if answer["survivors"]:
            raise SandboxExecError(
                f"sandbox {self.name}: processes survived SIGKILL: {answer['survivors']}"
            )
        return int(answer["killed"])

    async def prepare_grading(
        self,
        timeout_s: float = 10.0,
        *,
        record_image: bool = False,
        outputs: tuple[str, ...] | list[str] = (),
        strict: bool = False,
    ) -> GradingReset:
        """End the agent's reach before grading; what it left in the grading paths is returned.

        In the supervisor (the sandbox's pid 1): SIGKILL every other process of the sandbox's
        pid namespace until none is left, then put back the merged-/usr symlinks (/bin, /lib64,
        ...), make /, /logs, /run real dirs with their modes and /tests, /logs/verifier and the
        grader's HOME fresh, empty real dirs (symlinks and files in their place removed, locked
        subdirs unlocked and removed), and put the GRADING_HOOKS files back as the image had
        them. Nothing the agent started can run afterwards, so nothing can pre-seed, lock or
        rewrite what the verifier uses. `record_image=True` (the reset right after the image is
        built) takes the hook files present now as the image's own.

        Then the grader's own machinery (THREAT_MODEL.md): scratch space (GRADING_SCRATCH)
        emptied and toolchain config at / (TOOLCHAIN_HOOKS) put back as the image had them,
        except `outputs`, the paths the task declares as the agent's output (task.toml
        `[metadata] harness_outputs`). Those are listed in the answer's `reset`, not evidence.

        `strict=True` (task.toml `[metadata] harness_strict = true`; pass it to the recording
        reset too): every other entry of the writable root the agent changed is put back as
        the recording reset saw it (grading_strict.py), /logs and /tests aside; listed in
        `reset`. A grading reset with strict=True and no strict recording raises.
        """
        for path in outputs:
            if not str(path).startswith("/") or ".." in PurePosixPath(path).parts:
                raise SandboxPathError(f"a declared output must be absolute without '..': {path}")
        args = {
            "paths": [list(p) for p in GRADING_PATHS],
            "links": [list(link) for link in usr_links()],
            "hooks": list(GRADING_HOOKS),
            "toolchain": list(TOOLCHAIN_HOOKS),
            "scratch": list(GRADING_SCRATCH),
            "keep": [*(str(p) for p in outputs), GRADING_HOME],  # (GRADING_PATHS resets it)
            "record": record_image,
            "timeout": timeout_s,
            "strict": strict,
            "strict_keep": ["/logs", "/tests"],
        }
        answer = await self._supervisor_op("grading_reset", args)
        strict_errors = [e for e in answer["errors"] if str(e).startswith("strict mode:")]
        if strict_errors:  # the task's configuration, not the agent's doing: never evidence
            raise SandboxExecError(f"sandbox {self.name}: {'; '.join(strict_errors)}")
        return GradingReset(
            killed=int(answer["killed"]),
            survivors=list(answer["survivors"]),
            found=list(answer["found"]),
            errors=list(answer["errors"]),
            free_bytes=int(answer["free_bytes"]),
            free_inodes=int(answer["free_inodes"]),
            reset=list(answer.get("reset") or []),
        )

    async def _unless_pid1_dies(self, awaitable: Any) -> Any:
        """`awaitable`'s result, or SandboxDiedError as soon as pid 1 is gone.

        The host holds the control socket's listening end, so a command sent to a dead pid 1
        is queued, never refused: without this, it waited forever (issue 29, finding 10).
        """
        task = asyncio.ensure_future(awaitable)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.05)
                if done:
                    return task.result()
                if self._proc is not None and (self._proc.poll() is not None or self._pid1_dead()):
                    await self._settle()  # dead but not yet reaped: wait for bwrap's status
                    self._check_alive()  # raises: died, or stopped under us
                    raise SandboxClosedError(f"sandbox {self.name} is not running")
        finally:
            if not task.done():
                task.cancel()
                await asyncio.wait({task})

    def _pid1_dead(self) -> bool:
        """Whether the supervisor is a zombie or gone, read from /proc (bwrap may not have
        reaped it yet: on a loaded host bwrap can wait seconds for the CPU)."""
        if self._child_pid is None:
            return False
        try:
            stat = Path(f"/proc/{self._child_pid}/stat").read_text()
        except OSError:
            return True
        # "pid (comm) state ppid pgrp session tty tpgid flags ...", after the last ")" (comm may
        # hold one). A dying process closes its files (our channel sees EOF) before it turns
        # zombie; the kernel sets PF_EXITING in its flags first, so that is what tells.
        fields = stat[stat.rfind(")") + 2:].split()
        return fields[0] in ("Z", "X") or bool(int(fields[6]) & _PF_EXITING)

    async def _settle(self) -> None:
        """A broken channel: if pid 1 is dying, wait for bwrap to reap it so _check_alive tells
        the death apart from a plain channel error; if pid 1 is alive, return at once."""
        if self._proc is None:
            return
        deadline = time.monotonic() + _REAP_WAIT_S
        while self._proc.poll() is None and self._pid1_dead() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _supervisor_op(self, op: str, args: dict[str, object]) -> dict[str, object]:
        self._check_alive()
        assert self.dir is not None
        limit = _OP_TIMEOUT_S + float(args.get("timeout") or 0)  # type: ignore[arg-type]
        run = run_command(
            self.dir / "run" / "ctl.sock", [], env={}, cwd="/", timeout_s=None, op=op, op_args=args
        )
        try:
            result = await self._unless_pid1_dies(asyncio.wait_for(run, limit))
        except TimeoutError as exc:
            self._check_alive()
            raise SandboxExecError(
                f"sandbox {self.name}: the supervisor did not answer {op} within {limit:.0f} s; "
                f"log tail: {self._log_tail()!r}"
            ) from exc
        except SandboxExecError:
            await self._settle()
            self._check_alive()
            raise
        try:
            return marshal.loads(result.stdout)
        except (EOFError, ValueError, TypeError) as exc:
            raise SandboxExecError(
                f"sandbox {self.name}: the supervisor's {op} answer is unreadable ({exc}); "
                f"log tail: {self._log_tail()!r}"
            ) from exc
