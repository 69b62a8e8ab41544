"""Harbor environment backed by a local bubblewrap sandbox: Harbor trials with no docker daemon.

Use it by import path, the way Harbor plugs in any custom backend:

    EnvironmentConfig(import_path="harness.sandboxes.bwrap:BwrapEnvironment",
                      kwargs={"forward_urls": [proxy_url], "tool_paths": ["/work/main/.tools"]})

or construct it directly (Harbor's constructor arguments plus the keywords below):

    BwrapEnvironment(environment_dir=..., environment_name=..., session_id=...,
                     trial_paths=..., task_env_config=...,
                     ro_binds={host_path: sandbox_path},      # read-only extra binds
                     tool_paths=[".tools", ".mswea-venv"],   # host tools, bound where they live
                     forward={sandbox_port: "host:port"},    # 127.0.0.1:PORT inside -> host:port
                     forward_urls=[proxy_url],               # same, port taken from each URL
                     limits=SandboxLimits(...) or {...})

With `forward_urls=[url]` the agent uses `sandbox_url(url)` inside (the same URL with its host
set to 127.0.0.1). The task's environment/Dockerfile is read by `dockerfile.py` (WORKDIR, COPY,
ENV, RUN); the workdir is the task's [environment].workdir, else the Dockerfile's WORKDIR, else /app.

What is covered
- Namespaces: user, pid, net, ipc, uts, cgroup unshared (`bwrap --unshare-all`), all
  capabilities dropped, no_new_privs, new session; `--die-with-parent` kills it if we die.
- Filesystem: the host shows only as read-only /usr and /etc (non-world-readable /etc files
  masked) plus the read-only binds asked for; `/` is a private tmpfs capped at
  [environment].storage_mb (else 2 GiB, at most half the memory cap), gone at stop.
  The repo, $HOME, /work, /tmp of the host are not visible.
- Tests: the task's tests/ is never bound; Harbor's verifier uploads it to /tests at verify
  time, after the agent ran, replacing (not merging into) anything the agent put there. The
  solution is uploaded only by Harbor's oracle agent. `kill_agent_processes()` kills the
  agent's leftovers before grading (the session calls it; Harbor's Trial does not).
- Network: a fresh network namespace with only loopback. Each forwarded port is relayed to one
  host TCP address (the capture proxy); no other host port and no other address is reachable.
- Environment: every command starts from a clean environment (BASE_ENV + the task's and
  caller's variables). Nothing from the host process's environment passes.
- Limits: per-command wall time (process group SIGKILLed), file size, open files, core dumps
  off, process count (a pids cgroup where writable; RLIMIT_NPROC otherwise), memory (a
  memory cgroup where writable: [environment].memory_mb, else 4 GiB). Commands run with
  oom_score_adj 1000, so an OOM kills them, not the supervisor.
- Integrity of grading: commands inherit no descriptor but stdio, cannot ptrace or read the
  supervisor (it is non-dumpable) and cannot signal it (it is the namespace's pid 1), so they
  cannot forge a command's result or the verifier's files in transit.
- Teardown: stop() kills the sandbox's pid 1, so the kernel kills every process in it, then
  removes the relays, the cgroup and the private dir. `delete=False` still removes it.

What is not covered
- Kernel isolation: same kernel as the host (no VM, no seccomp filter beyond bwrap's default);
  a kernel exploit escapes.
- Identity: the sandbox's uid 0 maps to the host uid. On a root host it can read root-only
  files under /usr and what is bound (only /etc's are masked). `user=` on exec is ignored.
- Process cap on a root host without a writable pids cgroup (RLIMIT_NPROC does not bind root).
- CPU shares: no CPU limit. Disk: the private root is RAM (tmpfs), so a task that needs many
  GiB of scratch space needs storage_mb and the RAM to back it.
- An agent may lower its own oom_score_adj back to 0 and so make the supervisor an OOM
  candidate again: that ends its own rollout (an infra failure), it does not escape.
- Images: the "image" is the host's /usr. Dockerfile RUN steps run offline on it; a task that
  needs packages the host lacks fails (use a remote backend, see expose.py).
- Host-side symlinks in ro_binds are followed when binding (bwrap resolves the source).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.trial.paths import EnvironmentPaths

from harness.sandboxes.dockerfile import CopyStep, EnvironmentRecipe, RunStep, parse_dockerfile
from harness.sandboxes.errors import SandboxDefinitionError, SandboxStartError
from harness.sandboxes.limits import SandboxLimits
from harness.sandboxes.local import BwrapSandbox, SandboxSpec
from harness.sandboxes.mounts import resolved_tool_binds
from harness.sandboxes.ports import parse_forward, url_forward

__all__ = ["BwrapEnvironment"]

logger = logging.getLogger(__name__)

DEFAULT_WORKDIR = "/app"


class BwrapEnvironment(BaseEnvironment):
    """A Harbor `BaseEnvironment` running the task in a local bubblewrap sandbox."""

    def __init__(
        self,
        *args: Any,
        ro_binds: Mapping[str, str] | None = None,
        tool_paths: Sequence[str] | None = None,
        forward: Mapping[int | str, Any] | None = None,
        forward_urls: Sequence[str] | None = None,
        limits: SandboxLimits | Mapping[str, Any] | None = None,
        base_dir: str | Path | None = None,
        **kwargs: Any,
    ):
        binds = dict(ro_binds or {})
        if tool_paths:
            binds.update(resolved_tool_binds(*tool_paths))
        self._ro_binds = binds
        self._forward = parse_forward(forward or {})
        for url in forward_urls or ():
            self._forward.update(url_forward(url))
        if isinstance(limits, Mapping):
            limits = SandboxLimits(**limits)
        self._limits = limits or SandboxLimits()
        self._base_dir = Path(base_dir) if base_dir else None
        self._recipe = EnvironmentRecipe()
        self.sandbox: BwrapSandbox | None = None
        super().__init__(*args, **kwargs)
        for mount in self._host_mounts:  # explicit user mounts (Harbor log dirs are copied)
            if mount.get("type") != "bind" or not mount.get("read_only"):
                raise SandboxDefinitionError(
                    f"mount {mount.get('source')} -> {mount.get('target')}: the local sandbox "
                    "only binds host paths read-only (set read_only = true)"
                )
            self._ro_binds[mount["source"]] = mount["target"]

    @staticmethod
    def type() -> str:
        return "bwrap"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # disable_internet: the sandbox never has internet, whatever the task asks for.
        # Not `mounted`: log dirs are copied out through exec, so an agent's symlink in /logs
        # can never make Harbor read a host file.
        return EnvironmentCapabilities(disable_internet=True)

    def _validate_definition(self) -> None:
        dockerfile = self.environment_dir / "Dockerfile"
        if dockerfile.exists():
            self._recipe = parse_dockerfile(dockerfile, self.environment_dir)
        elif (self.environment_dir / "docker-compose.yaml").exists():
            raise SandboxDefinitionError(
                f"{self.environment_dir} defines a docker-compose environment; the local "
                "sandbox runs one process tree. Use --sandbox docker."
            )

    @property
    def workdir(self) -> str:
        return self.task_env_config.workdir or self._recipe.workdir or DEFAULT_WORKDIR

    async def start(self, force_build: bool) -> None:
        # Copies up to the first RUN go in as the sandbox's seed (copied in by start()); the
        # rest of the recipe runs in order inside the started sandbox.
        steps = list(self._recipe.steps)
        seed: dict[str, Path] = {}
        while steps and isinstance(steps[0], CopyStep):
            step = steps.pop(0)
            seed[step.target] = step.source
        spec = SandboxSpec(
            workdir=self.workdir,
            ro_binds=self._ro_binds,
            forward=self._forward,
            env={**self._recipe.env, **self._persistent_env},
            limits=self._with_task_resources(self._limits),
            seed=seed,
        )
        self.sandbox = BwrapSandbox(spec, name=self.session_id, base_dir=self._base_dir)
        await self.sandbox.start()
        try:
            for step in steps:
                await self._apply_step(step)
            await self._upload_environment_dir_after_start()
        except BaseException:
            await self.sandbox.stop()
            raise

    def _with_task_resources(self, limits: SandboxLimits) -> SandboxLimits:
        """The task's (or Harbor's override of its) memory_mb and storage_mb replace the caps."""
        if self._effective_memory_mb:
            limits = replace(limits, memory_mb=self._effective_memory_mb)
        if self._effective_storage_mb:
            limits = replace(limits, disk_mb=self._effective_storage_mb)
        return limits

    async def _apply_step(self, step: CopyStep | RunStep) -> None:
        assert self.sandbox is not None
        if isinstance(step, CopyStep):
            if step.source.is_dir():
                await self.sandbox.put_dir(step.source, step.target)
            else:
                await self.sandbox.put_file(step.source.read_bytes(), step.target)
            return
        result = await self.sandbox.shell(step.command, cwd=step.workdir, timeout_s=600)
        if result.return_code != 0:
            raise SandboxStartError(
                f"Dockerfile RUN at line {step.line} failed in the local sandbox (exit "
                f"{result.return_code}; it runs offline on the host's /usr): "
                f"{result.stderr.decode(errors='replace')[-800:]}"
            )

    async def stop(self, delete: bool) -> None:
        if self.sandbox is not None:
            await self.sandbox.stop()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self.sandbox is None:
            raise SandboxStartError(f"{self.session_id}: exec before start()")
        callback = self._output_callback()

        async def on_output(data: bytes, stream: str) -> None:
            assert callback is not None
            await callback(data.decode(errors="replace"), stream)  # type: ignore[arg-type]

        result = await self.sandbox.exec(
            ["/bin/sh", "-c", command],
            env=self._merge_env(env),
            cwd=cwd,
            timeout_s=timeout_sec,
            on_output=on_output if callback is not None else None,
        )
        return ExecResult(
            stdout=result.stdout.decode(errors="replace") or None,
            stderr=result.stderr.decode(errors="replace") or result.error,
            return_code=result.return_code,
        )

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        assert self.sandbox is not None
        await self.sandbox.put_file(Path(source_path).read_bytes(), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        assert self.sandbox is not None
        if target_dir.rstrip("/") == str(EnvironmentPaths.tests_dir):
            # The verifier's upload: replace, never merge, so a file the agent planted in
            # /tests (a conftest.py, a fake test) cannot take part in grading.
            await self.sandbox.exec(["rm", "-rf", "--", target_dir], cwd="/", timeout_s=120)
        await self.sandbox.put_dir(Path(source_dir), target_dir)

    async def kill_agent_processes(self) -> None:
        """Kill everything still running in the sandbox (the agent's leftovers) before grading.

        Harbor's Trial does not do this; a Harness session calls it after the agent phase and
        before `Verifier.verify()`.
        """
        if self.sandbox is not None:
            await self.sandbox.kill_processes()

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        assert self.sandbox is not None
        data = await self.sandbox.get_file(source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        assert self.sandbox is not None
        await self.sandbox.get_dir(source_dir, Path(target_dir))
