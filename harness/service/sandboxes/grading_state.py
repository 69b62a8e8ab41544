"""What the grader depends on in a sandbox, and what a grading reset reports: shared by backends.

The local sandbox's supervisor (local.py, supervisor.py) and the exec-only reset of Harbor's other
backends (grading.py) reset the same paths and hooks and report in the same `GradingReset`;
the verifier's test command gets GRADING_ENV everywhere. THREAT_MODEL.md says why each is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "GRADER_PYTHON_DIR",
    "GRADING_ENV",
    "GRADING_HOME",
    "GRADING_HOOKS",
    "GRADING_PATHS",
    "GRADING_SCRATCH",
    "MIN_FREE_BYTES",
    "MIN_FREE_INODES",
    "TOOLCHAIN_HOOKS",
    "GradingReset",
    "grading_env",
]

# The grader's HOME: fresh and empty at every grading, so nothing the agent left in a HOME (a
# usercustomize.py or .pth in the user site, ~/.bashrc, ~/.gitconfig, a `uv` in ~/.local/bin)
# reaches the grader's tools. World-writable (sticky), for a task whose verifier user is not root.
GRADING_HOME = "/run/harness-grading-home"

# What the verifier depends on, parents first: (path, mode, wipe). /tests, /logs/verifier and
# the grader's HOME are made fresh before grading; /, /logs, /run only have to be real dirs.
GRADING_PATHS: tuple[tuple[str, int, bool], ...] = (
    ("/", 0o755, False),
    ("/logs", 0o755, False),
    ("/tests", 0o755, True),
    ("/logs/verifier", 0o755, True),
    ("/run", 0o755, False),
    (GRADING_HOME, 0o1777, True),
)

# Files the grader's tools read uninvited from an ancestor of /tests (/ is the only one, and /
# is writable): pytest takes its rootdir and config from the first of these it finds walking up
# from the tests (findpaths.locate_config, then setup.py), and a config there moves its
# confcutdir to / so that /conftest.py is loaded too: one plugin that passes every test. Each
# is put back as the image had it (absent, nearly always) before grading.
GRADING_HOOKS: tuple[str, ...] = tuple(
    "/" + name
    for name in (
        "conftest.py",
        "pytest.toml",
        ".pytest.toml",
        "pytest.ini",
        ".pytest.ini",
        "pyproject.toml",
        "tox.ini",
        "setup.cfg",
        "setup.py",
    )
)

# Toolchain config the grader's tools read from an ancestor of /tests (/: node's require walks
# up to /node_modules, npm, go, cargo, uv, git, dotenv look there too), put back as the image
# had it before grading (grading_scratch.py). Unlike GRADING_HOOKS, not evidence: an honest
# agent may run `npm install` in /. A task that asks for one of them declares it an output.
TOOLCHAIN_HOOKS: tuple[str, ...] = tuple(
    "/" + name
    for name in """
    node_modules package.json package-lock.json .npmrc .yarnrc .yarnrc.yml .pnpmfile.cjs
    pnpm-workspace.yaml bunfig.toml deno.json deno.jsonc tsconfig.json jsconfig.json
    babel.config.js .babelrc jest.config.js vitest.config.js vitest.config.ts .mocharc.json
    .mocharc.yml .mocharc.js go.mod go.work Cargo.toml .cargo rust-toolchain rust-toolchain.toml
    .python-version uv.toml pyvenv.cfg .venv pip.conf pdm.toml poetry.toml Gemfile .bundle
    composer.json .git .env .tool-versions mise.toml .mise.toml .node-version .nvmrc
    sitecustomize.py
    """.split()  # noqa: SIM905 (a word list reads better than 45 quoted strings)
)

# The grader's scratch space: emptied before grading but for what the image put there, mount
# points and the task's declared outputs (grading_scratch.py).
GRADING_SCRATCH: tuple[str, ...] = ("/tmp", "/var/tmp", "/run")

# Where the grader's sitecustomize.py lives in the sandbox (supervisor_build.grader_python_dir,
# bound read-only): the work dir never shadows a module the grader's Python has elsewhere.
GRADER_PYTHON_DIR = "/run/harness-grader-python"

# Variables every grading command gets unless the task's own config sets them (the task's are
# its invitation; the agent can set none of them: each command's environment comes from the
# host). HOME: see GRADING_HOME. PYTHONNOUSERSITE: no user site even for a grader that sets
# HOME back. PYTHONPATH: the grader_site.py hook (no module of the work dir's shadows one the
# grader's Python has elsewhere; a dir that is absent, on other backends, is skipped).
# GIT_CONFIG_*: a grader running git in the agent's repo runs no hook the repo's .git names and
# no fsmonitor command (env-given config outranks the repo's own config).
GRADING_ENV: dict[str, str] = {
    "HOME": GRADING_HOME,
    "PYTHONPATH": GRADER_PYTHON_DIR,
    "PYTHONNOUSERSITE": "1",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": "/dev/null",
    "GIT_CONFIG_KEY_1": "core.fsmonitor",
    "GIT_CONFIG_VALUE_1": "false",
}


def grading_env(*task_envs: Mapping[str, str] | None) -> dict[str, str]:
    """GRADING_ENV less the keys any of the task's own environments set."""
    taken = {k for env in task_envs for k in (env or {})}
    return {k: v for k, v in GRADING_ENV.items() if k not in taken}


# Free space below which a grade cannot be trusted to be written (reward file, test logs).
MIN_FREE_BYTES = 1 << 20
MIN_FREE_INODES = 64


@dataclass
class GradingReset:
    """What `BwrapSandbox.prepare_grading()` did and found.

    killed:     processes of the sandbox that were SIGKILLed (the agent's and their leftovers)
    survivors:  processes still alive at the deadline (never expected: the kill is namespace-wide)
    found:      agent state in or above the grading dirs, now removed (pre-written reward, a
                planted /tests, a symlink or lock in their place)
    errors:     paths that could not be reset
    reset:      the agent's scratch files and toolchain config at / put back (not evidence)
    free_bytes / free_inodes: the sandbox root's free space after the reset (-1: not reported)
    """

    killed: int
    survivors: list[str]
    found: list[str]
    errors: list[str]
    free_bytes: int
    free_inodes: int
    reset: list[str] = field(default_factory=list)

    @property
    def evidence(self) -> list[str]:
        """Why a grade of this sandbox cannot be trusted to the agent's credit (empty: none).

        Everything here is state the agent left: the sandbox starts with fresh grading dirs and
        only the agent ran in it before grading. Processes it left running are not evidence
        (they are killed, and a server left behind is ordinary); a full disk is, since the
        verifier then cannot write its grade.
        """
        out = [f"process survived SIGKILL: {p}" for p in self.survivors]
        out += self.found + [f"could not reset {e}" for e in self.errors]
        if 0 <= self.free_bytes < MIN_FREE_BYTES:
            out.append(f"the sandbox's disk was full ({self.free_bytes} bytes free)")
        if 0 <= self.free_inodes < MIN_FREE_INODES:
            out.append(f"the sandbox's disk was out of inodes ({self.free_inodes} free)")
        return out
