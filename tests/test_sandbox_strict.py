# Run: .venv/bin/python -m pytest tests/test_sandbox_strict.py -x -q
"""Strict mode in the local sandbox: the grade depends on the declared outputs alone.

A task with `[metadata] harness_strict = true` has everything the agent changed in the writable
root outside its outputs put back as the image had it before grading (grading_strict.py), so a
grader that trusts a marker file or a config the task never asked for sees the image's. Each
test runs the real sandbox: a "build" writes the image's state, the recording reset takes it,
an "agent" command changes it, and the grading reset is checked from inside.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from harness.service.sandboxes import BwrapSandbox, SandboxSpec, environment_config
from harness.service.sandboxes.errors import SandboxDefinitionError, SandboxExecError
from harness.service.sandboxes.outputs import declared_strict

BUILD = (
    "mkdir -p /opt/svc /app/src && echo 'mode = safe' > /opt/svc/app.cfg && "
    "echo 'print(1)' > /app/src/main.py && chmod 0750 /opt/svc && ln -s /opt/svc /opt/current && "
    "mkdir -p /srv/vault && echo key > /srv/vault/k && chmod 000 /srv/vault/k /srv/vault"
)
AGENT = (
    "echo ok > /app/.tests_passed; echo 'mode = pass-everything' > /opt/svc/app.cfg; "
    "echo answer > /app/answer.txt; mkdir -p /app/out && echo r > /app/out/report.csv; "
    "rm /app/src/main.py; rm /opt/current && ln -s /tmp /opt/current; chmod 0777 /opt/svc; "
    "mkdir -p /node_modules/x /srv/locked && chmod 000 /srv/locked; echo log > /logs/agent/a.log; "
    "(echo planted >> /etc/hostname) 2>/dev/null && echo etc-written || echo etc-read-only"
)
CHECK = (
    "cat /app/.tests_passed 2>&1; cat /opt/svc/app.cfg; cat /app/answer.txt 2>&1; "
    "cat /app/out/report.csv; cat /app/src/main.py 2>&1; readlink /opt/current; "
    "stat -c %a /opt/svc; ls -d /node_modules /srv/locked 2>&1; cat /logs/agent/a.log; "
    "stat -c %a /srv/vault; chmod 700 /srv/vault; stat -c %a /srv/vault/k; "
    "chmod 600 /srv/vault/k; cat /srv/vault/k"
)
OUTPUTS = ("/app/answer.txt", "/app/out")
TASK = Path(__file__).parent / "fixtures" / "integrity-task"


async def _run(strict: bool) -> tuple[str, list[str], str]:
    box = BwrapSandbox(SandboxSpec(), name=f"strict-{strict}")
    await box.start()
    try:
        build = await box.shell(BUILD, timeout_s=60)
        assert build.return_code == 0, build.stderr
        await box.prepare_grading(record_image=True, outputs=OUTPUTS, strict=strict)
        agent = await box.shell(AGENT, timeout_s=60)
        reset = await box.prepare_grading(outputs=OUTPUTS, strict=strict)
        assert reset.evidence == [], reset  # strict mode resets state; it is not tampering
        check = await box.shell(CHECK, timeout_s=60)
        return check.stdout.decode() + check.stderr.decode(), reset.reset, agent.stdout.decode()
    finally:
        await box.stop()


async def test_strict_mode_puts_back_all_but_the_declared_outputs() -> None:
    out, reset, agent = await _run(strict=True)
    lines = out.splitlines()
    assert "No such file" in lines[0], out  # the marker file in /app: gone
    assert lines[1] == "mode = safe", out  # the image's config, edited by the agent: restored
    assert lines[2:4] == ["answer", "r"], out  # declared outputs (a file, a dir): kept
    assert lines[4] == "print(1)", out  # an image file the agent deleted: recreated
    assert lines[5:7] == ["/opt/svc", "750"], out  # the image's symlink and dir mode
    assert "No such file" in lines[7] and "No such file" in lines[8], out  # new dirs, locked too
    assert lines[9] == "log", out  # /logs is Harbor's, never reset
    assert lines[10:] == ["0", "0", "key"], out  # the build's locked dir and file, intact
    text = " | ".join(reset)
    for what in ("removed", "put back", "recreated", "/app/.tests_passed", "/opt/svc/app.cfg"):
        assert what in text, text
    assert "/srv/vault" not in text, text  # unchanged image entries are not rewritten
    # /etc is the host's, bound read-only: the agent cannot change it in either mode
    assert agent.strip() == "etc-read-only", agent


async def test_without_strict_mode_the_agents_state_survives() -> None:
    out, reset, agent = await _run(strict=False)
    lines = out.splitlines()
    assert lines[:5] == ["ok", "mode = pass-everything", "answer", "r", "cat: /app/src/main.py: No such file or directory"], out  # fmt: skip
    assert lines[5:7] == ["/tmp", "777"], out
    assert agent.strip() == "etc-read-only", agent
    assert not any("strict mode" in r for r in reset), reset


async def test_strict_grading_without_a_strict_recording_is_refused() -> None:
    box = BwrapSandbox(SandboxSpec(), name="strict-unrecorded")
    await box.start()
    try:
        await box.prepare_grading(record_image=True)
        with pytest.raises(SandboxExecError, match="no image was recorded"):
            await box.prepare_grading(strict=True)
    finally:
        await box.stop()


def test_harness_strict_is_read_and_checked(tmp_path: Path) -> None:
    toml = tmp_path / "task.toml"
    assert declared_strict(toml) is False
    toml.write_text("[metadata]\nharness_strict = true\n")
    assert declared_strict(toml) is True
    toml.write_text('[metadata]\nharness_strict = "yes"\n')
    with pytest.raises(SandboxDefinitionError, match="harness_strict must be true or false"):
        declared_strict(toml)


async def test_a_task_declaring_harness_strict_gets_it_through_the_harbor_environment(
    tmp_path: Path,
) -> None:
    """task.toml's [metadata] harness_strict reaches both resets of BwrapEnvironment."""
    task = tmp_path / "strict-task"
    shutil.copytree(TASK, task)
    toml = task / "task.toml"
    toml.write_text(
        toml.read_text().replace(
            "[metadata]\n",
            '[metadata]\nharness_strict = true\nharness_outputs = ["/app/answer.txt"]\n',
        )
    )
    (task / "environment" / "Dockerfile").write_text(
        "FROM ubuntu:24.04\nWORKDIR /app\nRUN mkdir -p /opt/svc && echo safe > /opt/svc/app.cfg\n"
    )
    loaded = Task(task)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        config=environment_config("local"),
        environment_dir=loaded.paths.environment_dir,
        environment_name=loaded.short_name,
        session_id="strict-harbor",
        trial_paths=paths,
        task_env_config=loaded.config.environment,
    )
    await env.start(force_build=False)
    try:
        await env.exec("echo ok > /app/.done; echo pass > /opt/svc/app.cfg; echo 42 > answer.txt")
        reset = await env.prepare_grading()
        assert reset.evidence == [], reset
        after = await env.exec("ls -A /app; cat /opt/svc/app.cfg /app/answer.txt")
        assert (after.stdout or "").split() == ["answer.txt", "safe", "42"], after
    finally:
        await env.stop(delete=True)
