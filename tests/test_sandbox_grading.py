# Run: .venv/bin/python -m pytest tests/test_sandbox_grading.py -x -q
"""Grading out of the agent's reach in the local sandbox: each test attacks one property.

The agent is a command run inside the sandbox (here, or an agent class in Harbor's own Trial);
the property is checked from the host: after `prepare_grading()` nothing the agent started is
alive, and the grading dirs are fresh real dirs whatever the agent left in their place.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from harbor.agents.base import BaseAgent
from harbor.environments.base import BaseEnvironment
from harbor.models.agent.context import AgentContext
from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
from harbor.trial.trial import Trial

from harness.service.sandboxes import (
    BwrapSandbox,
    SandboxLimits,
    SandboxSpec,
    environment_config,
    process_cap_mode,
)
from harness.service.sandboxes.local import GRADING_ENV, GRADING_HOME
from harness.service.sandboxes.mounts import usr_links, venv_binds
from tests.helpers.attacks import REWRITING_DAEMON, RecordingEnvironment
from tests.helpers.waiting import until

TASK = Path(__file__).parent / "fixtures" / "integrity-task"


@pytest.fixture
async def sandbox() -> AsyncIterator[BwrapSandbox]:
    box = BwrapSandbox(SandboxSpec(), name="grading")
    await box.start()
    try:
        yield box
    finally:
        await box.stop()


async def _sh(box: BwrapSandbox, script: str) -> tuple[int, str, str]:
    result = await box.shell(script, timeout_s=60)
    return result.return_code, result.stdout.decode(), result.stderr.decode()


async def _inside_pids(box: BwrapSandbox) -> list[str]:
    """Pids in the sandbox's /proc but pid 1 and the listing shell itself ($$)."""
    script = (
        'for p in /proc/[0-9]*; do n=${p#/proc/}; [ "$n" = 1 ] || [ "$n" = $$ ] || echo $n; done'
    )
    return (await _sh(box, script))[1].split()


async def _wait_for(box: BwrapSandbox, condition: str, what: str) -> None:
    """Poll a shell condition inside the sandbox until it holds (tests/helpers/waiting's deadline)."""

    async def holds() -> bool:
        return (await _sh(box, condition))[0] == 0

    await until(holds, what)


async def test_a_clean_sandbox_shows_no_evidence(sandbox: BwrapSandbox) -> None:
    # The false-positive check: an agent that did its work in /app and /tmp is not tampering.
    await _sh(sandbox, "echo work > /app/answer.txt; mkdir -p /tmp/x; echo log > /logs/agent/l")
    reset = await sandbox.prepare_grading()
    assert reset.evidence == [] and reset.survivors == [] and reset.errors == []
    assert (await _sh(sandbox, "cat /app/answer.txt /logs/agent/l"))[1] == "work\nlog\n"


@pytest.mark.parametrize(
    "leftover",
    [
        "setsid sh -c 'sleep 7001' >/dev/null 2>&1 &",
        "nohup sleep 7002 >/dev/null 2>&1 &",
        "sh -c 'sleep 7003 >/dev/null 2>&1 & exit 0'",  # double fork: the orphan is pid 1's
        "python3 -c 'import os,time\nif os.fork(): os._exit(0)\nos.setsid()\n"
        'if os.fork(): os._exit(0)\nos.execvp("sleep", ["sleep", "7004"])\' &',  # a daemon
        # its own pid namespace (as root of a new user namespace, where the kernel allows it)
        "unshare -Urpf --mount-proc sleep 7005 >/dev/null 2>&1 & sleep 7005 &",
    ],
    ids=["setsid", "nohup", "double-fork", "daemon", "nested-pid-namespace"],
)
async def test_no_process_the_agent_started_survives_the_reset(
    sandbox: BwrapSandbox, leftover: str
) -> None:
    await _sh(sandbox, leftover)
    await _wait_for(sandbox, "pgrep -f 'sleep 700[0-9]' >/dev/null", "the leftover to run")
    reset = await sandbox.prepare_grading()
    assert reset.killed >= 1 and reset.survivors == []
    assert await _inside_pids(sandbox) == []


async def test_a_fork_bomb_is_ended_whole(tmp_path: Path) -> None:
    mode, reason = process_cap_mode()
    if mode == "rlimit-only" and os.geteuid() == 0:  # an uncapped bomb would hit the whole host
        pytest.skip(f"no process cap can bind root here: {reason}")
    box = BwrapSandbox(SandboxSpec(limits=SandboxLimits(max_processes=64)), name="bomb")
    await box.start()
    try:
        # Each level sleeps: at the cap the bomb holds every pid instead of dying out.
        await _sh(box, "setsid sh -c 'b() { b & b & sleep 1000; }; b' >/dev/null 2>&1 &")
        await _wait_for(box, "[ $(ls -d /proc/[0-9]* | wc -l) -gt 20 ]", "the bomb to spread")
        reset = await box.prepare_grading()
        assert reset.survivors == [] and reset.killed > 20
        assert await _inside_pids(box) == []
    finally:
        await box.stop()


async def test_a_daemon_waiting_to_rewrite_the_tests_is_gone_before_they_arrive(
    sandbox: BwrapSandbox,
) -> None:
    # The first attack: rewrite tests/test.sh the moment the verifier uploads it.
    await _sh(
        sandbox,
        "setsid sh -c 'while :; do [ -f /tests/test.sh ] && "
        'echo "echo 1 > /logs/verifier/reward.txt" > /tests/test.sh; sleep 0.01; done\' '
        ">/dev/null 2>&1 &",
    )
    await _wait_for(sandbox, "pgrep -f 'whil[e] :' >/dev/null", "the daemon to run")
    reset = await sandbox.prepare_grading()
    # The reset's evidence before the verdict: it killed the daemon and nothing is left that
    # could touch the upload. With the kill removed this fails every time, whatever the
    # daemon's timing (a check of the file alone would depend on the daemon winning a race).
    assert reset.killed >= 1 and reset.survivors == [], reset
    assert await _inside_pids(sandbox) == []
    await sandbox.put_file(b"echo 0 > /logs/verifier/reward.txt\n", "/tests/test.sh")
    assert (await _sh(sandbox, "cat /tests/test.sh"))[1] == "echo 0 > /logs/verifier/reward.txt\n"


async def test_a_pre_written_reward_in_a_locked_dir_is_removed_and_reported(
    sandbox: BwrapSandbox,
) -> None:
    # The second attack: write a passing grade, then lock the reward folder.
    await _sh(sandbox, "echo 1 > /logs/verifier/reward.txt && chmod 555 /logs/verifier")
    reset = await sandbox.prepare_grading()
    assert any("/logs/verifier was locked" in e for e in reset.evidence), reset.evidence
    assert any("reward.txt" in e for e in reset.evidence), reset.evidence
    rc, out, err = await _sh(sandbox, "ls -A /logs/verifier && echo 0 > /logs/verifier/reward.txt")
    assert rc == 0 and out == "", err


async def test_a_planted_locked_tests_tree_is_wiped(sandbox: BwrapSandbox) -> None:
    await _sh(
        sandbox,
        "mkdir -p /tests/a/b && echo 'exit 0' > /tests/test.sh && echo x > /tests/a/b/c "
        "&& chmod 000 /tests/a/b && chmod 555 /tests/a /tests",
    )
    reset = await sandbox.prepare_grading()
    assert any(e.startswith("/tests held 2 entries") for e in reset.evidence), reset.evidence
    assert (await _sh(sandbox, "ls -A /tests; stat -c %a /tests"))[1] == "755\n"


@pytest.mark.parametrize("path", ["/tests", "/logs/verifier", "/logs"])
async def test_a_grading_dir_replaced_by_a_symlink_becomes_a_real_dir(
    sandbox: BwrapSandbox, path: str
) -> None:
    await _sh(sandbox, f"mkdir -p /app/decoy && rm -rf {path} && ln -s /app/decoy {path}")
    reset = await sandbox.prepare_grading()
    assert any(f"{path} was a symlink" in e for e in reset.evidence), reset.evidence
    rc, out, _ = await _sh(sandbox, f"[ -d {path} ] && [ ! -L {path} ] && stat -c %a {path}")
    assert rc == 0 and out == "755\n"
    assert (await _sh(sandbox, "[ -d /logs/verifier ] && [ ! -L /logs/verifier ]"))[0] == 0


async def test_a_locked_root_is_unlocked(sandbox: BwrapSandbox) -> None:
    await _sh(sandbox, "chmod 555 /logs && chmod 555 /")
    reset = await sandbox.prepare_grading()
    assert "/ was locked (mode 555)" in reset.evidence and "/logs was locked (mode 555)" in (
        reset.evidence
    )
    assert (await _sh(sandbox, "mkdir /tests/x && touch /logs/verifier/r"))[0] == 0


async def test_a_full_disk_is_evidence() -> None:
    limits = SandboxLimits(memory_mb=256, disk_mb=64)
    box = BwrapSandbox(SandboxSpec(limits=limits), name="full")
    await box.start()
    try:
        await _sh(box, "cat /dev/zero > /app/fill 2>/dev/null; true")
        reset = await box.prepare_grading()
        assert any("disk was full" in e for e in reset.evidence), reset.evidence
    finally:
        await box.stop()


# ---- hooks the grader's tools would pick up uninvited ----------------------------------------

VENV = Path(__file__).resolve().parents[1] / ".venv"  # a Python with pytest, bound read-only
# A conftest.py that turns every test's report into a pass: the one-line attack on a pytest grader.
PASS_ALL = (
    "import pytest\n"
    "@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n"
    "    outcome.get_result().outcome = 'passed'\n"
)
FAILING_TEST = b"def test_answer():\n    assert open('/app/answer.txt').read() == 'secret'\n"


def _python_with_pytest() -> str:
    python = VENV.resolve() / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} is missing: run ./setup.sh")
    return str(python)


async def test_a_pytest_config_and_conftest_at_root_are_removed_before_grading() -> None:
    python = _python_with_pytest()
    box = BwrapSandbox(SandboxSpec(ro_binds=venv_binds(VENV)), name="conftest")
    await box.start()
    try:
        run_tests = (
            f"echo wrong > /app/answer.txt; {python} -m pytest -q -p no:cacheprovider /tests"
        )
        await box.put_file(FAILING_TEST, "/tests/test_answer.py")
        # The attack works: /pytest.ini makes / pytest's rootdir (and confcutdir), so the
        # conftest.py there is loaded and the failing test passes.
        await box.put_file(b"[pytest]\n", "/pytest.ini")
        await box.put_file(PASS_ALL.encode(), "/conftest.py")
        rc, out, err = await _sh(box, run_tests)
        assert rc == 0 and "1 passed" in out, (out, err)

        reset = await box.prepare_grading()
        text = " | ".join(reset.evidence)
        assert "/pytest.ini (read by the grader's tools) was planted" in text, text
        assert "/conftest.py (read by the grader's tools) was planted" in text, text
        await box.put_file(FAILING_TEST, "/tests/test_answer.py")  # the verifier's upload
        rc, out, err = await _sh(box, run_tests)
        assert rc == 1 and "1 failed" in out, (out, err)
    finally:
        await box.stop()


async def test_hook_files_the_image_has_stay_and_changes_to_them_are_undone(
    sandbox: BwrapSandbox,
) -> None:
    await sandbox.put_file(b"[tool.pytest.ini_options]\n", "/pyproject.toml")
    assert (await sandbox.prepare_grading(record_image=True)).evidence == []
    assert (await sandbox.prepare_grading()).evidence == []  # the image's own: no evidence
    await _sh(
        sandbox, "printf '[tool.pytest.ini_options]\\naddopts = \"-p x\"\\n' > /pyproject.toml"
    )
    reset = await sandbox.prepare_grading()
    assert reset.evidence == ["/pyproject.toml (read by the grader's tools) was changed"]
    assert await sandbox.get_file("/pyproject.toml") == b"[tool.pytest.ini_options]\n"


async def test_a_replaced_bin_dir_is_put_back_before_the_graders_shebang_runs(
    sandbox: BwrapSandbox,
) -> None:
    links = dict(usr_links())
    if "/bin" not in links:
        pytest.skip("this host's /bin is a real dir (bound read-only): nothing to replace")
    # A /bin of the agent's: every tool as before, but a bash that writes a passing grade.
    await _sh(
        sandbox,
        "mkdir /fake && ln -s /usr/bin/* /fake/ && rm /fake/bash && "
        "printf '#!/usr/bin/sh\\necho 1 > /logs/verifier/reward.txt\\n' > /fake/bash && "
        "chmod +x /fake/bash && rm /bin && mv /fake /bin && "
        "rm /lib64 && mkdir /lib64",  # and the dynamic loader's dir (every ELF's interpreter)
    )
    reset = await sandbox.prepare_grading()
    assert f"/bin was not the image's symlink to {links['/bin']}" in reset.evidence
    if "/lib64" in links:
        assert f"/lib64 was not the image's symlink to {links['/lib64']}" in reset.evidence
    await sandbox.put_file(b"#!/bin/bash\necho $BASH_VERSION > /logs/verifier/v\n", "/tests/t.sh")
    rc, _, err = await _sh(sandbox, "chmod +x /tests/t.sh && /tests/t.sh")
    assert rc == 0, err
    assert (await sandbox.get_file("/logs/verifier/v")).strip()  # the real bash ran it


async def test_the_grading_env_leaves_the_agents_home_out(sandbox: BwrapSandbox) -> None:
    site = (await _sh(sandbox, "python3 -c 'import site; print(site.getusersitepackages())'"))[1]
    plant = f"mkdir -p {site.strip()} && echo 'print(\"HOOKED\")' > {site.strip()}/usercustomize.py"
    await _sh(sandbox, plant + " && echo 'echo HOOKED' > /root/.bashrc")
    assert "HOOKED" in (await _sh(sandbox, "python3 -c 'print(1)'"))[1]  # the attack is real
    reset = await sandbox.prepare_grading()
    assert reset.evidence == []  # the agent's own HOME is its business; the grader's is fresh
    result = await sandbox.exec(
        ["/bin/bash", "-c", "python3 -c 'print(1)'; ls -A ~; echo $HOME"],
        env=GRADING_ENV,
        timeout_s=60,
    )
    assert result.stdout.decode().split() == ["1", GRADING_HOME], result


async def test_a_pre_seeded_grading_home_is_evidence(sandbox: BwrapSandbox) -> None:
    await _sh(sandbox, f"mkdir -p {GRADING_HOME}/.local && echo x > {GRADING_HOME}/.bashrc")
    reset = await sandbox.prepare_grading()
    assert f"{GRADING_HOME} held 2 entries: .bashrc, .local" in reset.evidence, reset.evidence


# ---- Harbor's own Trial with the local sandbox ----------------------------------------------


class ScriptAgent(BaseAgent):
    """A Harbor agent that runs one shell script in the environment: a hostile policy's moves."""

    def __init__(self, *args: Any, script: str = "true", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.script = script

    @staticmethod
    def name() -> str:
        return "script-agent"

    def version(self) -> str | None:
        return "1"

    async def setup(self, environment: BaseEnvironment) -> None:
        return None

    async def run(self, instruction: str, environment: BaseEnvironment, context: AgentContext):
        result = await environment.exec(self.script, timeout_sec=60)
        # What the attack printed, for the test to check that it acted (SCRIPT_OUT).
        (self.logs_dir / SCRIPT_OUT).write_text(f"{result.stdout or ''}{result.stderr or ''}")


SCRIPT_OUT = "script-output.txt"  # in the trial's agent dir (Harbor's logs_dir for the agent)
RECORDING = "tests.helpers.attacks:RecordingEnvironment"


async def _trial_reward(tmp_path: Path, script: str, environment: Any = None) -> Any:
    """Harbor's Trial "attack" of the integrity task in tmp_path, `script` as the agent."""
    config = TrialConfig(
        task=TaskConfig(path=TASK),
        trials_dir=tmp_path,
        trial_name="attack",
        agent=AgentConfig(import_path=f"{__name__}:ScriptAgent", kwargs={"script": script}),
        environment=environment or environment_config("local"),
    )
    return await (await Trial.create(config)).run()


async def test_harbor_trial_a_setsid_daemon_rewriting_the_tests_earns_nothing(tmp_path: Path):
    # The grader runs only once the reset has killed the daemon or the daemon has acted
    # (tests/helpers/attacks.py): with the reset removed the attack wins, and this test fails, every time.
    result = await _trial_reward(
        tmp_path, REWRITING_DAEMON,
        environment=environment_config("local").model_copy(
            update={"import_path": "tests.helpers.attacks:AttackFirstEnvironment"}),
    )
    # The reset's evidence first: it found the daemon alive and killed it before grading.
    resets = RecordingEnvironment.of_trial(tmp_path / "attack").grading_resets
    assert any(r.killed >= 1 for r in resets), resets
    assert result.verifier_result is not None, result.exception_info
    assert result.verifier_result.rewards == {"reward": 0}


async def test_harbor_trial_a_locked_pre_written_reward_is_not_the_grade(tmp_path: Path):
    result = await _trial_reward(
        tmp_path,
        "echo 1 > /logs/verifier/reward.txt; chmod 555 /logs/verifier; "
        "mkdir -p /tests && printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh; "
        "chmod 555 /tests",
        environment=environment_config("local").model_copy(update={"import_path": RECORDING}),
    )
    # The attack acted (its grade and its tests were there, locked) and the reset found it.
    resets = RecordingEnvironment.of_trial(tmp_path / "attack").grading_resets
    evidence = " | ".join(e for r in resets for e in r.evidence)
    for expected in ("/logs/verifier was locked", "reward.txt", "/tests was locked", "test.sh"):
        assert expected in evidence, evidence
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    assert result.verifier_result.rewards == {"reward": 0}


USERCUSTOMIZE = (
    "site=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p $site && "
    "echo 'import os; os._exit(0)' > $site/usercustomize.py"  # every python3 'succeeds'
)


async def test_harbor_trial_a_usercustomize_for_the_graders_python_earns_nothing(tmp_path: Path):
    # The grader compares the answer in python3: the agent's usercustomize.py would end every
    # python3 with exit 0 (a pass) before it reads a line; the grader's HOME is fresh instead.
    # The script proves its hook live before the agent ends: a python3 that exits 3 exits 0.
    result = await _trial_reward(
        tmp_path, USERCUSTOMIZE + " && echo wrong > /app/answer.txt && "
        "python3 -c 'raise SystemExit(3)' && echo HOOK-LIVE")
    said = (tmp_path / "attack" / "agent" / SCRIPT_OUT).read_text()
    assert "HOOK-LIVE" in said, said
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    assert result.verifier_result.rewards == {"reward": 0}


def _pytest_task(root: Path) -> Path:
    """The integrity task with a pytest grader (the project venv's pytest, bound read-only)."""
    task = root / "pytest-task"
    shutil.copytree(TASK, task)
    (task / "tests" / "test_answer.py").write_text(
        "def test_answer():\n"
        "    assert open('/app/answer.txt').read().strip() == 'opal-kestrel-4417'\n"
    )
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        f"if {_python_with_pytest()} -m pytest -q -p no:cacheprovider /tests/test_answer.py; "
        "then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    return task


@pytest.mark.parametrize("honest", [False, True], ids=["conftest-attack", "oracle"])
async def test_harbor_trial_a_conftest_at_root_does_not_pass_a_pytest_grader(
    tmp_path: Path, honest: bool
) -> None:
    attack = f"printf '[pytest]\\n' > /pytest.ini && cat > /conftest.py <<'EOF'\n{PASS_ALL}EOF\n"
    agent = (
        AgentConfig(name="oracle")
        if honest
        else AgentConfig(import_path=f"{__name__}:ScriptAgent", kwargs={"script": attack})
    )
    config = TrialConfig(
        task=TaskConfig(path=_pytest_task(tmp_path)),
        trials_dir=tmp_path / "trials",
        trial_name="pytest",
        agent=agent,
        environment=environment_config("local", kwargs={"tool_paths": [str(VENV)]}),
    )
    result = await (await Trial.create(config)).run()
    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    assert result.verifier_result.rewards == {"reward": 1 if honest else 0}


async def test_harbor_trial_the_oracle_still_earns_one(tmp_path: Path):
    # The reset must not break honest grading: the task's own solution passes.
    config = TrialConfig(
        task=TaskConfig(path=TASK),
        trials_dir=tmp_path,
        trial_name="oracle",
        agent=AgentConfig(name="oracle"),
        environment=environment_config("local"),
    )
    result = await (await Trial.create(config)).run()
    assert result.verifier_result is not None, result.exception_info
    assert result.verifier_result.rewards == {"reward": 1}


# ---- the exec-only reset, for Harbor's remote backends ------------------------------------------


async def test_the_exec_only_reset_ends_leftovers_and_resets_the_grading_dirs(tmp_path: Path):
    # Docker, e2b, modal and daytona give only `exec`: the same attacks, reset through a shell
    # script. The local sandbox stands in for such a backend (the script sees only its /proc).
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from harness.service.sandboxes.grading import process_baseline, reset_for_grading

    task = Task(TASK)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        config=environment_config("local"),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id="exec-reset",
        trial_paths=paths,
        task_env_config=task.config.environment,
    )
    await env.start(force_build=False)
    try:
        baseline = await process_baseline(env)
        assert baseline and all(":" in e for e in baseline)  # at least the supervisor
        await env.exec(
            f"setsid sh -c 'sleep 7101' {'>/dev/null 2>&1 </dev/null'} & "
            "nohup sh -c 'while :; do sleep 0.01; done' >/dev/null 2>&1 </dev/null & "
            "echo 1 > /logs/verifier/reward.txt && chmod 555 /logs/verifier && "
            "mkdir -p /app/t && rm -rf /tests && ln -s /app/t /tests && chmod 555 /logs"
        )
        reset = await reset_for_grading(env, baseline)
        assert reset.survivors == [] and reset.killed >= 2 and reset.errors == []
        text = " | ".join(reset.evidence)
        for expected in (
            "/logs was locked (mode 555)",
            "/tests was a symlink to '/app/t'",
            "/logs/verifier was locked (mode 555)",
            "/logs/verifier held 1 entries: reward.txt",
        ):
            assert expected in text, text
        assert reset.free_bytes > 0
        after = await env.exec(
            'ls -A /tests /logs/verifier; [ -L /tests ] || echo real; pgrep -c -f "sleep 710[1]"'
        )
        assert (after.stdout or "").split() == ["/logs/verifier:", "/tests:", "real", "0"]
        clean = await reset_for_grading(env, baseline)  # nothing left: no evidence
        assert clean.evidence == [] and clean.killed == 0
    finally:
        await env.stop(delete=True)


async def test_the_exec_only_reset_removes_grader_hooks_the_image_did_not_have(tmp_path: Path):
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from harness.service.sandboxes.grading import process_baseline, reset_for_grading

    task = Task(TASK)
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    env = EnvironmentFactory.create_environment_from_config(
        config=environment_config("local"),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id="exec-hooks",
        trial_paths=paths,
        task_env_config=task.config.environment,
    )
    await env.start(force_build=False)
    try:
        await env.exec("printf '[tool.black]\\n' > /pyproject.toml")  # the image's own
        baseline = await process_baseline(env)
        assert "hook:/pyproject.toml:" in " ".join(baseline)
        await env.exec(
            "printf '[pytest]\\n' > /pytest.ini && echo 'import os' > /conftest.py && "
            f"mkdir -p {GRADING_HOME}/.local"
        )
        reset = await reset_for_grading(env, baseline)
        text = " | ".join(reset.evidence)
        for expected in (
            "/conftest.py (read by the grader's tools) was planted",
            "/pytest.ini (read by the grader's tools) was planted",
            f"{GRADING_HOME} held 1 entries: .local",
        ):
            assert expected in text, text
        assert "pyproject" not in text, text
        after = await env.exec(
            f"ls -A / {GRADING_HOME} | grep -E 'conftest|pytest|pyproject|local'"
        )
        assert (after.stdout or "").split() == ["pyproject.toml"], after
        await env.exec("echo x >> /pyproject.toml")
        changed = await reset_for_grading(env, baseline)
        assert changed.evidence == [
            "/pyproject.toml (read by the grader's tools) was planted, changed or removed"
        ]
    finally:
        await env.stop(delete=True)


async def test_a_git_grader_runs_no_hook_or_fsmonitor_of_the_agents_repo(
    sandbox: BwrapSandbox,
) -> None:
    # A grader that restores its test files with git in the agent's repo (SWE-bench style).
    setup = (
        "cd /app && git init -q && git -c user.name=a -c user.email=a@b commit -q --allow-empty "
        "-m 0 && echo 'echo 1 > /logs/verifier/reward.txt' > .git/hooks/post-checkout && "
        "chmod +x .git/hooks/post-checkout && echo x > f && git add f && "
        "git -c user.name=a -c user.email=a@b commit -q -m 1 && "
        "git config core.fsmonitor 'echo 1 > /logs/verifier/fsmonitor #'"
    )
    rc, _, err = await _sh(sandbox, setup)
    assert rc == 0, err
    grader = ["/bin/sh", "-c", "cd /app && git status -s && git checkout -q -- f"]
    await sandbox.exec(grader, timeout_s=60)  # the attack is real without the grading env
    assert (await _sh(sandbox, "ls /logs/verifier"))[1].split() == ["fsmonitor", "reward.txt"]
    await sandbox.prepare_grading()
    result = await sandbox.exec(grader, env=GRADING_ENV, timeout_s=60)
    assert result.return_code == 0, result
    assert (await _sh(sandbox, "ls -A /logs/verifier"))[1] == ""
