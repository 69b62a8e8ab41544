"""Which of Harbor's commands and uploads open the verifier's grading phase, for bwrap.py.

Harbor's own Trial does not know the local sandbox's grading reset, so `BwrapEnvironment` starts it
itself at the verifier's first step and gives the verifier's test command the grader's
environment. That needs the verifier's commands recognised exactly as harbor's Verifier builds
them (harbor.utils.scripts' quoting, `EnvironmentPaths`): a looser match could let a setup command
that merely mentions /tests start grading early. Pure functions of the command and the
environment's OS, kept apart so the environment class reads as its life (start, exec, grade).
"""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from harbor.models.trial.paths import EnvironmentPaths
from harbor.utils.scripts import quote_shell_arg

if TYPE_CHECKING:
    from harbor.models.task.config import TaskOS

__all__ = ["is_verifier_preamble", "is_verifier_test_command", "touches_grading"]


def is_verifier_preamble(command: str, task_os: TaskOS | None) -> bool:
    """True for the command Harbor's Verifier runs first: `rm -f -- <reward.txt> <reward.json>`.

    Matched exactly (quoted as Harbor quotes it): an agent's own commands never reach this
    check (they run inside its process), and a looser match could let a setup command that
    merely mentions /tests start grading early. The other entries of a grading phase
    (uploading /tests, `empty_dirs` / `reset_dirs` of the verifier dir) are caught where they
    arrive, in BwrapEnvironment's `upload_dir` / `upload_file` / `empty_dirs` / `reset_dirs`.
    """
    paths = EnvironmentPaths.for_os(task_os)
    rewards = (paths.reward_text_path, paths.reward_json_path)
    return command.strip() == "rm -f -- " + " ".join(
        quote_shell_arg(p, task_os) for p in rewards
    )


def is_verifier_test_command(command: str, task_os: TaskOS | None) -> bool:
    """True for the command Harbor's Verifier runs the tests with: `(<a script under
    /tests>) > <verifier dir>/test-stdout.txt 2>&1` (harbor.utils.scripts'
    build_execution_command), matched exactly as `is_verifier_preamble` is."""
    paths = EnvironmentPaths.for_os(task_os)
    stdout = quote_shell_arg(str(paths.verifier_dir / "test-stdout.txt"), task_os)
    suffix = f") > {stdout} 2>&1"
    text = command.strip()
    if not (text.startswith("(") and text.endswith(suffix)):
        return False
    script = text[1 : -len(suffix)]
    try:
        words = shlex.split(script)
    except ValueError:
        return False
    tests = str(paths.tests_dir).rstrip("/") + "/"
    return (
        len(words) == 1
        and words[0].startswith(tests)
        and quote_shell_arg(words[0], task_os) == script
    )


def touches_grading(task_os: TaskOS | None, *targets: Any) -> bool:
    """True when any target is /tests or the verifier's log dir, or lies under one of them."""
    paths = EnvironmentPaths.for_os(task_os)
    roots = (str(paths.tests_dir).rstrip("/"), str(paths.verifier_dir).rstrip("/"))
    for target in targets:
        t = str(target).rstrip("/")
        if any(t == root or t.startswith(root + "/") for root in roots):
            return True
    return False
