# Run: .venv/bin/python -m pytest tests/test_sandbox_harbor.py -x -q
"""The bubblewrap sandbox as Harbor sees it: Harbor's own Trial, oracle agent and verifier.

Every bundled task must earn reward 1 from Harbor's oracle agent (its solution/solve.sh) in the
local sandbox, through Harbor's Trial (environment by import path, verifier uploading tests/).
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.task import Task
from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.models.trial.paths import TrialPaths
from harbor.trial.trial import Trial

from harness.service.sandboxes import (
    SandboxDefinitionError,
    SandboxExecTimeoutError,
    SandboxStartError,
    environment_config,
    resolved_tool_binds,
)
from harness.service.sandboxes.bwrap import BwrapEnvironment
from harness.tasks import BUNDLED_DIR, bundled_tasks
from launchers.paths import REPO_ROOT

IMPORT_PATH = "harness.service.sandboxes.bwrap:BwrapEnvironment"
BUNDLED = [task.name for task in bundled_tasks()]


def _trial_config(task_dir: Path, trials_dir: Path, **env_kwargs) -> TrialConfig:
    return TrialConfig(
        task=TaskConfig(path=task_dir),
        trials_dir=trials_dir,
        trial_name=f"oracle-{task_dir.name}",
        agent=AgentConfig(name="oracle"),
        environment=environment_config("local", kwargs=env_kwargs),
    )


@pytest.mark.parametrize("name", BUNDLED)
async def test_harbor_oracle_earns_reward_one_in_the_local_sandbox(name: str, tmp_path: Path):
    trial = await Trial.create(_trial_config(BUNDLED_DIR / name, tmp_path))
    result = await trial.run()
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    assert result.verifier_result.rewards["reward"] == 1


async def test_the_multi_reward_task_reports_every_reward_key(tmp_path: Path):
    trial = await Trial.create(_trial_config(BUNDLED_DIR / "csv-report", tmp_path))
    result = await trial.run()
    assert result.verifier_result is not None
    assert result.verifier_result.rewards == {
        "reward": 1.0,
        "has_file": 1.0,
        "has_header": 1.0,
        "correct_rows": 1.0,
    }


async def test_an_untouched_task_earns_reward_zero(tmp_path: Path):
    # The nop agent changes nothing: the verifier must really grade, not hand out ones.
    config = _trial_config(BUNDLED_DIR / "fix-python-function", tmp_path)
    config.agent = AgentConfig(name="nop")
    result = await (await Trial.create(config)).run()
    assert result.verifier_result is not None
    assert result.verifier_result.rewards["reward"] == 0


def _environment(task_dir: Path, tmp_path: Path, **kwargs) -> BwrapEnvironment:
    task = Task(task_dir)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        config=environment_config("local", kwargs=kwargs),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id=f"test-{task.short_name}",
        trial_paths=paths,
        task_env_config=task.config.environment,
        logger=logging.getLogger("test"),
    )
    assert isinstance(env, BwrapEnvironment)
    return env


async def test_dockerfile_workdir_and_copies_shape_the_sandbox(tmp_path: Path):
    env = _environment(BUNDLED_DIR / "rename-across-files", tmp_path)
    await env.start(force_build=False)
    try:
        result = await env.exec("pwd; find . -name '*.py' | sort")
    finally:
        await env.stop(delete=True)
    assert result.stdout is not None
    lines = result.stdout.split()
    assert lines[0] == "/app"
    assert lines[1:] == ["./app/__init__.py", "./app/report.py", "./app/users.py", "./main.py"]


def _task_with_dockerfile(tmp_path: Path, dockerfile: str) -> Path:
    task_dir = tmp_path / "task"
    (task_dir / "environment").mkdir(parents=True)
    (task_dir / "tests").mkdir()
    (task_dir / "instruction.md").write_text("do it\n")
    (task_dir / "task.toml").write_text('schema_version = "1.4"\n')
    (task_dir / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (task_dir / "environment" / "Dockerfile").write_text(dockerfile)
    (task_dir / "environment" / "data.txt").write_text("seed\n")
    return task_dir


async def test_dockerfile_run_env_and_copy_after_run_apply_in_order(tmp_path: Path):
    task_dir = _task_with_dockerfile(
        tmp_path,
        "FROM ubuntu:24.04\nWORKDIR /srv/work\nENV GREETING=hello MODE=test\n"
        "RUN echo built > built.txt\nCOPY data.txt ./\n",
    )
    env = _environment(task_dir, tmp_path)
    await env.start(force_build=False)
    try:
        result = await env.exec('echo "$GREETING $MODE"; cat built.txt data.txt; pwd')
    finally:
        await env.stop(delete=True)
    assert result.stdout == "hello test\nbuilt\nseed\n/srv/work\n"


async def test_a_multi_stage_dockerfile_is_refused_with_the_fix(tmp_path: Path):
    task_dir = _task_with_dockerfile(
        tmp_path, "FROM golang AS build\nFROM ubuntu\nCOPY --from=build /out /app/out\n"
    )
    with pytest.raises(SandboxDefinitionError, match="--sandbox docker"):
        _environment(task_dir, tmp_path)


async def test_a_failing_dockerfile_run_fails_the_start_and_cleans_up(tmp_path: Path):
    task_dir = _task_with_dockerfile(tmp_path, "FROM ubuntu\nRUN apt-get install -y nothing-x\n")
    env = _environment(task_dir, tmp_path)
    with pytest.raises(SandboxStartError, match="RUN at line 2"):
        await env.start(force_build=False)
    assert env.sandbox is not None and env.sandbox.dir is not None
    assert not env.sandbox.dir.exists()


async def test_exec_timeout_raises_like_harbors_own_environments(tmp_path: Path):
    env = _environment(BUNDLED_DIR / "hello-file", tmp_path)
    await env.start(force_build=False)
    try:
        # Harbor's docker backend raises RuntimeError on timeout; ours is a subclass of it.
        with pytest.raises(RuntimeError, match="timed out") as info:
            await env.exec("sleep 30", timeout_sec=1)
        assert isinstance(info.value, SandboxExecTimeoutError)
    finally:
        await env.stop(delete=True)


async def test_upload_and_download_round_trip_files_and_dirs(tmp_path: Path):
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "nested" / "b.bin").write_bytes(bytes(range(256)))
    env = _environment(BUNDLED_DIR / "hello-file", tmp_path)
    await env.start(force_build=False)
    try:
        await env.upload_dir(src, "/data/in")
        await env.upload_file(src / "a.txt", "/data/single/a.txt")
        await env.download_dir("/data/in", tmp_path / "out")
        await env.download_file("/data/single/a.txt", tmp_path / "one.txt")
    finally:
        await env.stop(delete=True)
    assert (tmp_path / "out" / "a.txt").read_text() == "alpha"
    assert (tmp_path / "out" / "nested" / "b.bin").read_bytes() == bytes(range(256))
    assert (tmp_path / "one.txt").read_text() == "alpha"


async def test_task_env_and_caller_env_reach_commands_and_caller_wins(tmp_path: Path):
    env = _environment(BUNDLED_DIR / "hello-file", tmp_path)
    await env.start(force_build=False)
    try:
        with env.scoped_exec_env({"SCOPED": "s"}):
            result = await env.exec('echo "$SCOPED $CALLER $HOME"', env={"CALLER": "c"})
    finally:
        await env.stop(delete=True)
    assert result.stdout == "s c /root\n"


async def test_agent_clis_run_inside_through_read_only_tool_binds(tmp_path: Path):
    tools, mswea = REPO_ROOT / ".tools", REPO_ROOT / ".mswea-venv"
    if not (tools.exists() and mswea.exists()):
        pytest.skip(f"agent CLIs not installed ({tools}, {mswea}): run ./setup.sh")
    env = _environment(BUNDLED_DIR / "hello-file", tmp_path, tool_paths=[str(tools), str(mswea)])
    codex = (tools / "codex").resolve()
    python = mswea.resolve() / "bin" / "python"  # the venv dir resolved, not its python link
    await env.start(force_build=False)
    try:
        codex_out = await env.exec(f"{codex} --version", timeout_sec=60)
        mini_out = await env.exec(f"{python} -c 'import minisweagent'", timeout_sec=60)
    finally:
        await env.stop(delete=True)
    assert codex_out.return_code == 0 and "codex" in (codex_out.stdout or "")
    assert mini_out.return_code == 0, mini_out.stderr


def test_tool_binds_cover_the_npm_prefix_and_the_venvs_base_python():
    mswea = REPO_ROOT / ".mswea-venv"
    if not mswea.exists():
        pytest.skip(f"{mswea} not installed: run ./setup.sh")
    binds = resolved_tool_binds(mswea)
    home = [line for line in (mswea / "pyvenv.cfg").read_text().splitlines() if "home" in line]
    base = Path(home[0].split("=", 1)[1].strip()).resolve().parent
    assert str(mswea.resolve()) in binds
    assert str(base) in binds or str(base).startswith("/usr")


async def test_stopping_many_sandboxes_at_once_leaves_no_private_dirs(tmp_path: Path):
    envs = [_environment(BUNDLED_DIR / "hello-file", tmp_path / str(i)) for i in range(8)]
    await asyncio.gather(*(e.start(force_build=False) for e in envs))
    dirs = [e.sandbox.dir for e in envs if e.sandbox is not None]
    await asyncio.gather(*(e.stop(delete=True) for e in envs))
    assert len(dirs) == 8 and not any(d is not None and d.exists() for d in dirs)
    assert os.path.isdir(tmp_path)


async def test_files_the_agent_planted_in_tests_are_gone_when_the_verifier_uploads(
    tmp_path: Path,
):
    env = _environment(BUNDLED_DIR / "fix-python-function", tmp_path)
    await env.start(force_build=False)
    try:
        await env.exec("mkdir -p /tests && echo 'import sys; sys.exit(0)' > /tests/conftest.py")
        await env.upload_dir(BUNDLED_DIR / "fix-python-function" / "tests", "/tests")
        listing = await env.exec("ls /tests")
    finally:
        await env.stop(delete=True)
    assert sorted((listing.stdout or "").split()) == ["test.sh", "test_stats.py"]


async def test_harbor_output_callbacks_receive_the_command_output_as_it_streams(tmp_path: Path):
    env = _environment(BUNDLED_DIR / "hello-file", tmp_path)
    chunks: list[tuple[str, str]] = []

    async def collect(text: str, stream: str) -> None:
        chunks.append((stream, text))

    await env.start(force_build=False)
    try:
        with env.scoped_output_callback(collect):
            result = await env.exec("echo out; echo err >&2")
    finally:
        await env.stop(delete=True)
    assert ("stdout", "out\n") in chunks and ("stderr", "err\n") in chunks
    assert result.stdout == "out\n" and result.stderr == "err\n"


def test_the_sandboxes_package_exports_exactly_its_public_names():
    import harness.service.sandboxes as package

    public = {n for n in dir(package) if not n.startswith("_")} - {
        "annotations",
        "Any",
        # submodules are attributes once imported, not exports
        "bwrap", "channel", "dockerfile", "errors", "expose", "grading", "limits", "local",
        "local_launch", "local_files", "local_pid1_ops", "verifier_commands",
        "grading_state", "mounts", "outputs", "ports", "supervisor", "supervisor_build",
    }  # fmt: skip
    assert set(package.__all__) == public | {"BwrapEnvironment"}
    assert package.BwrapEnvironment is BwrapEnvironment
