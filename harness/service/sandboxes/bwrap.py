"""Harbor environment backed by a local bubblewrap sandbox: Harbor trials with no docker daemon.

Use it by import path, the way Harbor plugs in any custom backend:

    EnvironmentConfig(import_path="harness.service.sandboxes.bwrap:BwrapEnvironment",
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
- Tests and solution: the task's tests/ and solution/ are never bound; Harbor's verifier
  uploads tests/ to /tests at verify time, after the agent ran, replacing (not merging into)
  anything there. The solution is uploaded only by Harbor's oracle agent.
- Grading out of the agent's reach (the threat: the policy is an optimizer against its grade).
  Before the verifier starts, `prepare_grading()` has the supervisor, the sandbox's pid 1,
  SIGKILL every other process of the sandbox's pid namespace until /proc shows none (setsid,
  nohup, double forks, daemons, nested pid namespaces: all have a pid there), then make /,
  /logs real dirs with their modes and /tests, /logs/verifier fresh empty real dirs (symlinks
  and files in their place removed, locked trees unlocked and removed). What it found there
  (a pre-written reward, a planted or locked /tests, a symlink, a lock, a full disk) is
  returned as evidence: a Harness session then scores the rollout 0.0 with cause `tampered`,
  inside the group baseline, without running the verifier. A verifier that still gives no
  grade is the agent's doing when a grading command was killed by a signal, the disk is full,
  or the grader grades a fresh sandbox of the task (a control run); only a grader that fails
  there too, or a broken sandbox, is `verifier_failure`.
- Hooks for the grader's own tools. The grader runs in the sandbox the agent used, so what its
  interpreters and tools read uninvited must not be the agent's. Removed at the reset (and
  evidence, `tampered`): a /bin, /sbin, /lib, /lib64 ... of the agent's in place of the image's
  merged-/usr symlinks (they live in the writable root: the grader's `#!/bin/bash` and every
  program's dynamic loader go through them); pytest's config files and conftest.py at /, the
  one ancestor of /tests (a /pytest.ini there makes / pytest's rootdir and confcutdir, so a
  /conftest.py that passes every test is loaded), unless the image had them as they are; a
  pre-seeded grader HOME. The verifier's test command runs with local.GRADING_ENV (what the
  task's own config sets wins): HOME a fresh empty dir, so nothing in the agent's HOME
  reaches it (a usercustomize.py, sitecustomize.py, .pth or a whole shadowing package in the
  user site, ~/.bashrc or ~/.profile for a login shell, ~/.gitconfig, a `uv` or `pytest` in
  ~/.local/bin); PYTHONNOUSERSITE=1 even for a grader that sets HOME back; git with no hooks
  and no fsmonitor command, whatever the repo's .git/config says. PATH holds read-only system
  dirs only (/usr, and the /bin, /sbin links put back), /etc (profile.d, ld.so.preload,
  sitecustomize of the system Python) is read-only, and BASH_ENV, ENV, PYTHONPATH,
  PYTHONSTARTUP, LD_PRELOAD come only from the host (BASE_ENV, the task's config): the agent
  can set no variable of a later command, and a non-interactive `#!/bin/bash` reads no rc file.
- The grader's own machinery (THREAT_MODEL.md, issue 29): /dev is read-only for the sandbox's
  whole life (its fd/stdin/stdout/stderr links are the kernel's; the host's device nodes are
  remounted read-only by pid 1, which then drops the only two capabilities it had; /dev/shm is
  a capped tmpfs of its own, part of disk_mb); the grader's Python gets grader_site.py as its
  sitecustomize (GRADING_ENV's PYTHONPATH): a module it can find outside the work dir is never
  taken from the work dir; the scratch space (/tmp, /var/tmp, /run) is emptied and toolchain
  config at / (local.TOOLCHAIN_HOOKS: /node_modules, /package.json, /go.mod, /.git, ...) put
  back as the image had it, unless the task declares it (task.toml [metadata]
  harness_outputs); these two are reported, not evidence. A task with [metadata]
  harness_strict = true gets the whole writable root but its outputs, /logs and /tests put back
  as the image had it (grading_strict.py), so its grade depends on its outputs alone. pid 1
  outlives a connection flood (reserved descriptor, relay cap); if it dies anyway, the rollout
  is `tampered`.
- Harbor's own Trial gets the same reset: the environment runs it itself at the verifier's
  first step (its reward-file removal, an `empty_dirs`/`reset_dirs` of the verifier dir, or an
  upload to /tests) whenever anything else ran since the last reset, and its test command
  (matched exactly as Harbor builds it: verifier_commands.py) gets GRADING_ENV. Harbor has no
  `tampered` cause: there a pre-written reward or a planted hook is simply removed and the task
  is graded on its merits.
- Network: a fresh network namespace with only loopback. Each forwarded port is relayed to one
  host TCP address (the capture proxy); no other host port and no other address is reachable.
- Environment: every command starts from a clean environment (BASE_ENV + the task's and
  caller's variables). Nothing from the host process's environment passes.
- Limits: per-command wall time (process group SIGKILLed), file size, open files, core dumps
  off, process count (a pids cgroup where writable; RLIMIT_NPROC otherwise), memory (a
  memory cgroup where writable: [environment].memory_mb, else 4 GiB). Commands run with
  oom_score_adj 1000, so an OOM kills them, not the supervisor.
- Integrity of the channel: commands inherit no descriptor but stdio, cannot ptrace or read
  the supervisor (it is non-dumpable) and cannot signal it (it is the namespace's pid 1), so
  they cannot forge a command's result or the verifier's files in transit.
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
- Grading runs the task's tests in the sandbox the agent used: a grader that imports or runs
  the agent's code can be fooled by that code in ways no reset prevents (that is the task's
  test design; Harbor's separate-verifier mode copies artifacts into a fresh environment).
  The answer itself may be a symlink to a grader file; a grader must not compare the answer
  with a file under /tests.
- What a grader invites stays the task's: the verifier runs in the work dir (as `docker exec`
  does, and graders rely on it), so `python -m pytest` or `python -c` there puts the agent's
  dir first on sys.path: grader_site.py keeps the grader's own modules (the standard
  library's, pytest) from being shadowed there, but a module only the work dir has is the
  agent's (that is how graders import the answer), and a grader run with -I/-S/-E or a task
  that sets PYTHONPATH itself opts out. PYTHONSAFEPATH would drop the dir and fail graders that
  import the agent's code, so it is not set. Likewise a pytest run on tests inside
  the work dir reads the agent's conftest.py and config there; a task that puts an
  agent-writable dir on PATH or PYTHONPATH (Dockerfile ENV), sets BASH_ENV to a file in the
  writable root, or has its grader `source` a file the agent can write, runs what the agent
  left there; a git grader in the agent's repo still runs the filters and diff drivers its
  .git/config and .gitattributes name (hooks and fsmonitor are off). Files the image's build
  wrote to the writable root (a venv under /opt, say) are the agent's to change, as in docker.
  Entries the image put in /tmp (and toolchain dirs the image has at /) are not reset.

Harbor's other backends (docker, e2b, modal, daytona), under a Harness session
- The session takes a baseline of the environment's own processes (pid and start time) after
  start and, before the verifier, runs harness/service/sandboxes/grading.py through `exec`: SIGKILL
  every process not in the baseline (and not its own ancestors) until none is left, the same
  fresh grading dirs (the grader's HOME among them), pytest's config and conftest.py at /
  removed unless the baseline had them unchanged, the same evidence and `tampered` cause, and
  the verifier runs with the same GRADING_ENV. It reaches what the exec user may reach: as
  root in the container (Harbor's images) that is all the agent could start or leave, within
  the environment's pid namespace. The image itself is not covered there: the agent is root
  over it and may change the grader's interpreter, pytest or /bin in place.
- docker: a container on the host's kernel (namespaces, cgroups, the image's seccomp/AppArmor
  profile); the agent is root in it. No kernel isolation beyond docker's. A docker-compose
  task's other services are not reset.
- e2b: a Firecracker micro-VM per sandbox (its own kernel); exec goes through the e2b daemon
  inside it, which is in the baseline and never killed.
- modal: a gVisor sandbox (a user-space kernel); daytona: a container-based sandbox with a
  daemon inside for exec (in the baseline). Neither is tested here (no account, no network).
- Harbor's own Trial on these backends gets only Harbor's behaviour: the reward files are
  removed and tests/ is uploaded over whatever the agent left at /tests; nothing the agent
  left running is killed. Use a Harness session (or Harbor's separate-verifier mode) for
  grading that a policy is trained against.
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

from harness.service.sandboxes.dockerfile import (
    CopyStep,
    EnvironmentRecipe,
    RunStep,
    parse_dockerfile,
)
from harness.service.sandboxes.errors import (
    SandboxDefinitionError,
    SandboxExecError,
    SandboxPathError,
    SandboxStartError,
)
from harness.service.sandboxes.limits import SandboxLimits
from harness.service.sandboxes.local import BwrapSandbox, GradingReset, SandboxSpec, grading_env
from harness.service.sandboxes.mounts import resolved_tool_binds
from harness.service.sandboxes.outputs import declared_outputs, declared_strict
from harness.service.sandboxes.ports import parse_forward, url_forward
from harness.service.sandboxes.verifier_commands import (
    is_verifier_preamble,
    is_verifier_test_command,
    touches_grading,
)

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
        self._outputs: tuple[str, ...] = ()  # task.toml's [metadata] harness_outputs
        self._strict = False  # task.toml's [metadata] harness_strict (grading_strict.py)
        self.sandbox: BwrapSandbox | None = None
        # Grading state: whether anything but grading ran since the last reset, each reset's
        # report, and each command since the last reset with its exit code (the verifier's,
        # when a reset just happened: a grader killed by a signal shows here).
        self._agent_ran = False
        self.grading_resets: list[GradingReset] = []
        self.commands_since_reset: list[tuple[str, int]] = []
        super().__init__(*args, **kwargs)
        for mount in self._host_mounts:  # explicit user mounts (Harbor log dirs are copied)
            if mount.get("type") != "bind" or not mount.get("read_only"):
                raise SandboxDefinitionError(
                    f"mount {mount.get('source')} -> {mount.get('target')}: the local sandbox "
                    "only binds host paths read-only (set read_only = true)"
                )
            self._ro_binds[mount["source"]] = mount["target"]

    # /run/harness-grader-python is a read-only mount of the supervisor's build here: an
    # exec-only grading reset run over this environment (tests) leaves it alone (grading.py).
    mounts_grader_python_dir = True

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
        self._outputs = declared_outputs(self.environment_dir.parent / "task.toml")
        self._strict = declared_strict(self.environment_dir.parent / "task.toml")
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
            # The image is built: nothing of the build keeps running (as with docker build), and
            # the grading dirs start fresh, so anything found in them at grading is the agent's.
            await self.sandbox.prepare_grading(record_image=True, strict=self._strict)
        except BaseException:
            await self.sandbox.stop()
            raise
        self._agent_ran = False

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
        grading = is_verifier_preamble(command, self.os)
        if grading:
            await self._grading_starts()
        else:
            self._agent_ran = True
        callback = self._output_callback()

        async def on_output(data: bytes, stream: str) -> None:
            assert callback is not None
            await callback(data.decode(errors="replace"), stream)  # type: ignore[arg-type]

        merged = self._merge_env(env)
        if is_verifier_test_command(command, self.os):
            # The grader's environment (local.GRADING_ENV) under the task's own variables.
            extra = grading_env(merged, self.sandbox.spec.env)
            # grader_site.py: the work dir's modules never shadow the grader's own
            extra["HARNESS_GRADER_WORKDIR"] = self.workdir
            merged = {**extra, **(merged or {})}
        result = await self.sandbox.exec(
            ["/bin/sh", "-c", command],
            env=merged,
            cwd=cwd,
            timeout_s=timeout_sec,
            on_output=on_output if callback is not None else None,
        )
        self.commands_since_reset.append((command, result.return_code))
        return ExecResult(
            stdout=result.stdout.decode(errors="replace") or None,
            stderr=result.stderr.decode(errors="replace") or result.error,
            return_code=result.return_code,
        )

    # -- grading out of the agent's reach ---------------------------------------------------------
    async def prepare_grading(self) -> GradingReset:
        """Kill every process of the sandbox and make the grading dirs fresh (see local.py).

        The Harness session calls it between the agent and the verifier and reads the returned
        evidence. Harbor's own Trial does not know it: for that path the environment calls it
        itself, at the verifier's first step after anything else ran (`_grading_starts`).
        """
        if self.sandbox is None:
            raise SandboxStartError(f"{self.session_id}: prepare_grading before start()")
        reset = await self.sandbox.prepare_grading(outputs=self._outputs, strict=self._strict)
        self._agent_ran = False
        self.commands_since_reset = []
        self.grading_resets.append(reset)
        return reset

    async def _grading_starts(self) -> None:
        """The verifier is about to touch /tests or /logs/verifier: if anything but grading ran
        since the last reset (the agent, its setup, a log upload), reset first. A process that
        survives the kill stops the grading (Harbor's Trial records the error): it could still
        reach what the verifier reads."""
        if self._agent_ran:
            reset = await self.prepare_grading()
            if reset.survivors:
                raise SandboxExecError(
                    f"{self.session_id}: processes survived SIGKILL before grading: "
                    f"{reset.survivors}"
                )

    async def empty_dirs(self, dirs: Any, *, chmod: bool = True) -> Any:
        if touches_grading(self.os, *dirs):
            await self._grading_starts()
            result = await super().empty_dirs(dirs, chmod=chmod)
            self._agent_ran = False  # that command was the verifier's own
            return result
        return await super().empty_dirs(dirs, chmod=chmod)

    async def reset_dirs(
        self, *, remove_dirs: Any, create_dirs: Any, chmod_dirs: Any = None
    ) -> Any:
        if touches_grading(self.os, *remove_dirs, *create_dirs):
            await self._grading_starts()
            result = await super().reset_dirs(
                remove_dirs=remove_dirs, create_dirs=create_dirs, chmod_dirs=chmod_dirs
            )
            self._agent_ran = False
            return result
        return await super().reset_dirs(
            remove_dirs=remove_dirs, create_dirs=create_dirs, chmod_dirs=chmod_dirs
        )

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        assert self.sandbox is not None
        if touches_grading(self.os, target_path):
            await self._grading_starts()
        else:
            self._agent_ran = True
        await self.sandbox.put_file(Path(source_path).read_bytes(), target_path)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        assert self.sandbox is not None
        if not touches_grading(self.os, target_dir):
            self._agent_ran = True
            await self.sandbox.put_dir(Path(source_dir), target_dir)
            return
        await self._grading_starts()
        if target_dir.rstrip("/") == str(EnvironmentPaths.for_os(self.os).tests_dir):
            # Replace, never merge: after a reset /tests is empty anyway; a second verifier
            # upload (another step) must not merge into the first one's files either.
            result = await self.sandbox.exec(
                ["rm", "-rf", "--", target_dir], cwd="/", timeout_s=120
            )
            if result.return_code != 0:
                raise SandboxPathError(
                    f"could not clear {target_dir} before the verifier's upload: "
                    f"{result.stderr.decode(errors='replace')[-300:]}"
                )
        await self.sandbox.put_dir(Path(source_dir), target_dir)

    async def kill_agent_processes(self) -> int:
        """Kill everything still running in the sandbox; how many. `prepare_grading()` does this
        and resets the grading dirs: use that before a verifier."""
        if self.sandbox is None:
            return 0
        return await self.sandbox.kill_processes()

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        assert self.sandbox is not None
        data = await self.sandbox.get_file(source_path)
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        assert self.sandbox is not None
        await self.sandbox.get_dir(source_dir, Path(target_dir))
