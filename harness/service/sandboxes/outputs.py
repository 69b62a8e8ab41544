"""The paths a task declares as the agent's output: kept by the grading reset's strict parts.

    # task.toml
    [metadata]
    harness_outputs = ["/tmp/report.csv", "/package.json"]

Before grading, the sandbox empties the grader's scratch space (/tmp, /var/tmp, /run) and puts
the toolchain config at / back as the image had it (local.GRADING_SCRATCH, TOOLCHAIN_HOOKS): a
task whose answer lives there declares it here, and that path (and what is inside it) is left as
the agent made it. Paths outside those places need no declaration.

    harness_strict = true

Strict mode (grading_strict.py): before grading, everything the agent changed in the sandbox's
writable root outside the declared outputs (and /logs, /tests) is put back as the image had it,
so the grade can depend on the outputs alone. The local sandbox only (see THREAT_MODEL.md).
"""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath

from harness.service.sandboxes.errors import SandboxDefinitionError

__all__ = ["declared_outputs", "declared_strict"]


def _metadata(task_toml: Path) -> dict[str, object]:
    if not task_toml.is_file():
        return {}
    try:
        data = tomllib.loads(task_toml.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SandboxDefinitionError(f"{task_toml}: unreadable ({exc})") from exc
    return data.get("metadata") or {}


def declared_strict(task_toml: Path) -> bool:
    """`[metadata] harness_strict` of a task.toml; False when absent."""
    raw = _metadata(task_toml).get("harness_strict", False)
    if not isinstance(raw, bool):
        raise SandboxDefinitionError(
            f"{task_toml}: [metadata] harness_strict must be true or false; got {raw!r}"
        )
    return raw


def declared_outputs(task_toml: Path) -> tuple[str, ...]:
    """`[metadata] harness_outputs` of a task.toml (absolute sandbox paths); () when absent."""
    raw = _metadata(task_toml).get("harness_outputs", [])
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        raise SandboxDefinitionError(
            f"{task_toml}: [metadata] harness_outputs must be a list of absolute paths, "
            f'e.g. ["/tmp/report.csv"]; got {raw!r}'
        )
    for path in raw:
        pure = PurePosixPath(path)
        if not pure.is_absolute() or ".." in pure.parts or pure == PurePosixPath("/"):
            raise SandboxDefinitionError(
                f"{task_toml}: harness_outputs entry {path!r} must be an absolute path below / "
                "without '..'"
            )
    return tuple(str(PurePosixPath(p)) for p in raw)
