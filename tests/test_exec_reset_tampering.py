# Run: .venv/bin/python -m pytest tests/test_exec_reset_tampering.py -q
"""The exec-only grading reset (docker, e2b, modal, daytona) trusts no binary of the image.

On those backends the agent is root over the image: it can replace rm, chmod, stat, sed, ls, cp,
tar... with tools that report success and do nothing. The reset (harness/service/sandboxes/grading.py)
runs a static helper of its own, uploaded through the backend's file API, so a tampered image
changes nothing about what it kills, removes and reports.

The backend here is a fake exec-only one: Harbor's environment API (`exec`, `upload_file`) over
the real local sandbox, where every command finds the agent's lying tools first on its PATH, as
it would on an image whose /usr/bin the agent rewrote (the local sandbox keeps /usr read-only, so
the tools go in a dir of the agent's that the backend's PATH puts first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from harness.service.sandboxes import environment_config
from harness.service.sandboxes.grading import GRADER_SITE, process_baseline
from harness.service.sandboxes.grading import reset_for_grading as _reset_for_grading

TASK = Path(__file__).parent / "fixtures" / "integrity-task"
EVIL = "/opt/evil"
# Every tool the previous (shell) reset used, and the usual file tools: each one lies.
TOOLS = "rm cp mv tar chmod chown stat sed cut ls cksum mkdir find sleep wc sort head tr readlink"
BG = ">/dev/null 2>&1 </dev/null &"
# Where the grader Python's sitecustomize.py is uploaded here: the real path
# (GRADER_PYTHON_DIR) is the local sandbox's own read-only mount, which an exec-only image lacks.
GRADER_DIR = "/opt/harness-grader-python"


async def reset_for_grading(backend: Any, baseline: list[str]) -> Any:
    return await _reset_for_grading(backend, baseline, grader_python_dir=GRADER_DIR)


class TamperedImage:
    """An exec-only backend over `env` whose PATH finds the agent's tools first."""

    os = "linux"

    def __init__(self, env: Any) -> None:
        self.env = env

    async def exec(self, command: str, **kwargs: Any) -> Any:
        return await self.env.exec(f"export PATH={EVIL}:$PATH\n{command}", **kwargs)

    async def upload_file(self, source_path: Any, target_path: str) -> None:
        await self.env.upload_file(source_path, target_path)


@pytest.fixture
async def env(tmp_path: Path) -> Any:
    task = Task(TASK)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    environment = EnvironmentFactory.create_environment_from_config(
        config=environment_config("local"),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id="exec-tamper",
        trial_paths=paths,
        task_env_config=task.config.environment,
    )
    await environment.start(force_build=False)
    try:
        yield environment
    finally:
        await environment.stop(delete=True)


async def _tamper(raw: Any) -> None:
    """The agent's turn: lying tools first on the PATH, then its usual leftovers."""
    await raw.exec(
        f"mkdir -p {EVIL} && for t in {TOOLS}; do printf '#!/bin/sh\\nexit 0\\n' > {EVIL}/$t "
        f"&& chmod 755 {EVIL}/$t; done"
    )
    await raw.exec(
        f"setsid sh -c 'exec sleep 7201' {BG} "
        f"nohup sh -c 'while :; do echo 1 > /logs/verifier/reward.txt; done' {BG} "
        "echo 1 > /logs/verifier/reward.txt && chmod 555 /logs/verifier && "
        "mkdir -p /app/t && rm -rf /tests && ln -s /app/t /tests && "
        "{ rm -rf /dev/fd && mkdir /dev/fd && echo same > /dev/fd/63; } 2>/dev/null; "
        "echo 'import os' > /conftest.py"
    )


async def test_a_tampered_image_changes_nothing_the_reset_does(env: Any) -> None:
    backend = TamperedImage(env)
    baseline = await process_baseline(backend)
    await _tamper(env)
    # The lies are in effect: the image's rm, as the backend runs it, removes nothing.
    probe = await backend.exec(
        "mkdir /app/probe; rm -rf /app/probe; [ -d /app/probe ] || echo gone"
    )
    assert "gone" in (probe.stdout or ""), "the fake tools are not in use: the test proves nothing"

    reset = await reset_for_grading(backend, baseline)

    assert reset.survivors == [] and reset.errors == [] and reset.killed >= 2, reset
    text = " | ".join(reset.evidence)
    # (The agent's `rm -rf /dev/fd` fails here: the local sandbox standing in for the image keeps
    # /dev read-only, so "/dev/fd was replaced" cannot be found; /dev/fd is checked below.)
    for expected in (
        "/tests was a symlink to '/app/t'",
        "/logs/verifier was locked (mode 555)",
        "/logs/verifier held 1 entries: reward.txt",
        "/conftest.py (read by the grader's tools) was planted",
    ):
        assert expected in text, text
    # Checked with the sandbox's own tools, not the lying ones.
    after = await env.exec(
        "ls -A /tests /logs/verifier; [ -L /tests ] || echo real-tests; "
        "readlink /dev/fd; [ -e /conftest.py ] || echo no-conftest; "
        'pgrep -c -f "sleep 720[1]"; pgrep -c -f "reward.tx[t]"'
    )
    assert (after.stdout or "").split() == [
        "/logs/verifier:",
        "/tests:",
        "real-tests",
        "/proc/self/fd",
        "no-conftest",
        "0",
        "0",
    ], after
    assert reset.free_bytes > 0


async def test_a_helper_the_agent_replaced_is_uploaded_fresh_and_reported(env: Any) -> None:
    backend = TamperedImage(env)
    baseline = await process_baseline(backend)
    helper = next(e for e in baseline if e.startswith("helper:"))[len("helper:") :]
    # The agent finds the helper and makes it forge a clean report ...
    await env.exec(
        f"setsid sh -c 'exec sleep 7202' {BG} "
        "echo 1 > /logs/verifier/reward.txt && "
        f"rm -f {helper} && printf '#!/bin/sh\\necho killed 0\\n' > {helper} && chmod 644 {helper}"
    )
    reset = await reset_for_grading(backend, baseline)
    # ... and what runs is the helper's fresh bytes: the daemon is gone, the reward removed.
    text = " | ".join(reset.evidence)
    assert f"{helper} (the grading reset helper) was removed or changed" in text, text
    assert "/logs/verifier held 1 entries: reward.txt" in text, text
    assert reset.killed >= 1 and reset.survivors == [], reset
    left = await env.exec('pgrep -c -f "sleep 720[2]"; ls -A /logs/verifier | wc -l')
    assert (left.stdout or "").split() == ["0", "0"], left


async def test_a_clean_sandbox_shows_no_evidence_through_the_helper(env: Any) -> None:
    backend = TamperedImage(env)
    baseline = await process_baseline(backend)
    assert any(e.startswith("helper:/") for e in baseline) and any(
        ":" in e and e.split(":")[0].isdigit() for e in baseline
    ), baseline
    reset = await reset_for_grading(backend, baseline)
    assert reset.evidence == [] and reset.killed == 0, reset


async def test_the_grader_pythons_sitecustomize_is_uploaded_fresh_at_each_grading(env: Any) -> None:
    backend = TamperedImage(env)
    baseline = await process_baseline(backend)
    # The agent plants the dir first on the grader's PYTHONPATH before the first grading ...
    await env.exec(
        f"mkdir -p {GRADER_DIR} && echo 'import os' > {GRADER_DIR}/configparser.py && "
        f"echo 'print(1)' > {GRADER_DIR}/sitecustomize.py"
    )
    reset = await reset_for_grading(backend, baseline)
    assert f"{GRADER_DIR} held 2 entries: configparser.py, sitecustomize.py" in reset.evidence
    fresh = GRADER_SITE.read_bytes()
    assert await _bytes(env, f"{GRADER_DIR}/sitecustomize.py") == fresh
    listing = await env.exec(f"ls -A {GRADER_DIR}")
    assert (listing.stdout or "").split() == ["sitecustomize.py"], listing
    # ... and a grader's Python run from the work dir takes the stdlib's json, not the agent's
    check = await env.exec(
        "cd /app && echo 'raise SystemExit(7)' > json.py && "
        "python3 -c 'import json, sys; print(json.__file__, sys.modules[\"sitecustomize\"].__file__)'",
        env={"PYTHONPATH": GRADER_DIR, "HARNESS_GRADER_WORKDIR": "/app"},
    )
    json_file, site_file = (check.stdout or "").split()
    assert json_file.startswith("/usr/lib/python3") and site_file.startswith(GRADER_DIR), check
    # A later grading: the last upload is no evidence; a tampered copy is replaced by fresh bytes
    await env.exec(f"echo 'print(2)' > {GRADER_DIR}/sitecustomize.py; rm -f /app/json.py")
    again = await reset_for_grading(backend, baseline)
    assert again.evidence == [], again
    assert await _bytes(env, f"{GRADER_DIR}/sitecustomize.py") == fresh


async def _bytes(env: Any, path: str) -> bytes:
    assert env.sandbox is not None
    return await env.sandbox.get_file(path)
