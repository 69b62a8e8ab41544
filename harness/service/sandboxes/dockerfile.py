"""Read the part of a task's environment/Dockerfile that a local sandbox can honour.

The local sandbox has no image builder and no registry: its "image" is the host's /usr and /etc.
So of a Dockerfile it honours only what shapes the task's files and variables:

    WORKDIR dir            the sandbox's working directory (created)
    COPY/ADD src... dest   local files from environment/ (ADD of a URL is refused; a local
                           archive is copied, not extracted)
    ENV k=v ... / ENV k v  variables for every command
    RUN cmd                run inside the started sandbox, offline, in file order
    FROM, ARG, LABEL, USER, EXPOSE, CMD, ENTRYPOINT, SHELL, HEALTHCHECK, STOPSIGNAL, VOLUME,
    ONBUILD, MAINTAINER    recorded or ignored (the base image is the host)

and refuses, with the fix named, what would silently differ: `COPY --from` (multi-stage builds),
`ADD <url>`, sources outside environment/. A RUN that needs the network (apt-get, pip) fails
like it would on an offline Docker build; such tasks need `--sandbox docker` or another remote
backend.
"""

from __future__ import annotations

import glob
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from harness.service.sandboxes.errors import SandboxDefinitionError

__all__ = ["CopyStep", "EnvironmentRecipe", "RunStep", "parse_dockerfile"]

_IGNORED = {
    "ARG", "LABEL", "USER", "EXPOSE", "CMD", "ENTRYPOINT", "SHELL", "HEALTHCHECK",
    "STOPSIGNAL", "VOLUME", "ONBUILD", "MAINTAINER",
}  # fmt: skip


@dataclass(frozen=True)
class CopyStep:
    """Copy host `source` (file or directory contents) to exactly `target` in the sandbox."""

    source: Path
    target: str


@dataclass(frozen=True)
class RunStep:
    command: str
    workdir: str
    line: int


@dataclass
class EnvironmentRecipe:
    base_image: str | None = None
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    steps: list[CopyStep | RunStep] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    buf, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue
        if not buf:
            start = number
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        lines.append((start, buf + stripped))
        buf = ""
    if buf:
        lines.append((start, buf))
    return lines


def _resolve(workdir: str, path: str) -> str:
    p = PurePosixPath(path)
    return str(p if p.is_absolute() else PurePosixPath(workdir) / p)


def parse_dockerfile(dockerfile: Path, context: Path) -> EnvironmentRecipe:
    """Parse `dockerfile` (sources relative to `context`); SandboxDefinitionError on what we refuse."""
    recipe = EnvironmentRecipe()
    workdir = "/"
    known_dirs = {"/"}  # Docker copies *into* a destination that already is a directory
    context = context.resolve()

    def fail(line: int, why: str) -> SandboxDefinitionError:
        return SandboxDefinitionError(
            f"{dockerfile}:{line}: {why}. The local (bubblewrap) sandbox builds no images; "
            "run this task with a Docker-capable backend (--sandbox docker|e2b|daytona|modal)."
        )

    for line, text in _logical_lines(dockerfile.read_text()):
        instr, _, rest = text.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        if instr == "FROM":
            recipe.base_image = rest.split()[0] if rest else None
        elif instr == "WORKDIR":
            workdir = _resolve(workdir, rest.strip("\"'"))
            recipe.workdir = workdir
            known_dirs.add(workdir)
        elif instr == "ENV":
            parts = shlex.split(rest)
            if parts and all("=" in p for p in parts):
                recipe.env.update(p.split("=", 1) for p in parts)
            elif len(parts) >= 2:
                recipe.env[parts[0]] = rest.split(None, 1)[1]
            else:
                raise fail(line, f"cannot read ENV {rest!r}")
        elif instr in ("COPY", "ADD"):
            recipe.steps.extend(_copy_steps(instr, rest, workdir, context, line, fail, known_dirs))
        elif instr == "RUN":
            command = rest
            if rest.startswith("["):
                command = shlex.join(json.loads(rest))
            recipe.steps.append(RunStep(command=command, workdir=workdir, line=line))
        elif instr in _IGNORED:
            recipe.ignored.append(f"{line}: {instr}")
        else:
            raise fail(line, f"unknown instruction {instr}")
    return recipe


def _copy_steps(instr, rest, workdir, context, line, fail, known_dirs) -> list[CopyStep]:
    args = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    flags = [a for a in args if a.startswith("--")]
    args = [a for a in args if not a.startswith("--")]
    if any(f.startswith("--from") for f in flags):
        raise fail(line, f"{instr} --from (a multi-stage build) needs an image build")
    if len(args) < 2:
        raise fail(line, f"{instr} needs a source and a destination")
    *sources, dest = args
    dest_path = _resolve(workdir, dest)
    into_dir = dest.endswith("/") or len(sources) > 1 or dest_path in known_dirs
    steps: list[CopyStep] = []
    for src in sources:
        if "://" in src:
            raise fail(line, f"ADD of a URL ({src}) needs the network")
        matches = sorted(glob.glob(str(context / src))) or [str(context / src)]
        for match in matches:
            path = Path(match).resolve()
            if path != context and context not in path.parents:
                raise fail(line, f"{src} is outside the build context {context}")
            if not path.exists():
                raise fail(line, f"{src} does not exist in {context}")
            if path.is_dir():
                steps.append(CopyStep(path, dest_path))
                known_dirs.add(dest_path)
            elif into_dir or len(matches) > 1:
                steps.append(CopyStep(path, str(PurePosixPath(dest_path) / path.name)))
            else:
                steps.append(CopyStep(path, dest_path))
    return steps
