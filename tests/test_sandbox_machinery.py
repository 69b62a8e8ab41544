# Run: .venv/bin/python -m pytest tests/test_sandbox_machinery.py -x -q
"""The grader's own machinery in the local sandbox, one property per test (issue 29).

Each test attacks the real sandbox (bubblewrap, the real supervisor as pid 1) from inside, as
an agent's command would, and checks the property from the host: /dev is the kernel's and the
host's device nodes are out of reach, the grader's Python takes its modules from its own
paths, scratch space and toolchain config at / are fresh for grading (declared outputs kept),
pid 1 outlives a flood of connections, its code is built where no one else can write, and its
death or silence is reported, not waited on forever. The end-to-end versions, through a real
agent and Harbor's verifier, are in tests/test_reward_integrity_machinery.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harness.service.sandboxes import local, local_pid1_ops, supervisor_build
from harness.service.sandboxes.errors import (
    SandboxDefinitionError,
    SandboxDiedError,
    SandboxExecError,
    SandboxStartError,
    SandboxUnavailableError,
)
from harness.service.sandboxes.limits import SandboxLimits
from harness.service.sandboxes.local import GRADING_ENV, BwrapSandbox, SandboxSpec
from harness.service.sandboxes.outputs import declared_outputs
from harness.service.session_grading import sandbox_died


@pytest.fixture
async def sandbox() -> AsyncIterator[BwrapSandbox]:
    box = BwrapSandbox(SandboxSpec(), name="machinery")
    await box.start()
    await box.prepare_grading(record_image=True)
    try:
        yield box
    finally:
        await box.stop()


async def _sh(box: BwrapSandbox, script: str, **env: str) -> tuple[int, str, str]:
    result = await box.exec(["/bin/bash", "-c", script], timeout_s=60, env=env or None)
    return result.return_code, result.stdout.decode(), result.stderr.decode()


# ---- /dev ------------------------------------------------------------------------------------


async def test_dev_is_the_kernels_whatever_the_agent_does(sandbox: BwrapSandbox) -> None:
    rc, out, err = await _sh(
        sandbox,
        "rm -rf /dev/fd; mkdir /dev/fd; rm -f /dev/stdin; echo x > /dev/planted; "
        "readlink /dev/fd /dev/stdin; diff <(echo a) <(echo b) >/dev/null; echo diff=$?",
    )
    assert "Read-only file system" in err, err
    assert out.split() == ["/proc/self/fd", "/proc/self/fd/0", "diff=1"], out


async def test_the_hosts_device_nodes_cannot_be_changed_and_still_work(
    sandbox: BwrapSandbox,
) -> None:
    before = {p: os.stat(p) for p in ("/dev/null", "/dev/full", "/dev/urandom")}
    rc, out, err = await _sh(
        sandbox,
        "chmod 600 /dev/null; touch /dev/full; chmod 600 /dev/urandom; "
        "echo ok > /dev/null && head -c 8 /dev/urandom | wc -c && head -c 3 /dev/zero | wc -c",
    )
    assert err.count("Read-only file system") == 3, err
    assert out.split() == ["8", "3"], out
    for path, st in before.items():
        now = os.stat(path)
        assert (now.st_mode, now.st_ctime_ns) == (st.st_mode, st.st_ctime_ns), path


async def test_commands_have_no_capability(sandbox: BwrapSandbox) -> None:
    rc, out, _ = await _sh(sandbox, "grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status")
    values = [line.split()[1] for line in out.splitlines()]
    assert len(values) == 4 and set(values) == {"0000000000000000"}, out


async def test_dev_shm_is_capped_and_counted_in_the_disk() -> None:
    limits = SandboxLimits(memory_mb=512, disk_mb=128)
    assert limits.shm_size_bytes() + limits.root_size_bytes() == 128 << 20
    box = BwrapSandbox(SandboxSpec(limits=limits), name="shm")
    await box.start()
    try:
        rc, out, err = await _sh(
            box, "head -c 64M /dev/zero > /dev/shm/fill; df -B1 --output=size /dev/shm | tail -1"
        )
        assert "No space left" in err, err
        assert int(out.split()[-1]) == limits.shm_size_bytes(), out
    finally:
        await box.stop()


# ---- the grader's Python ---------------------------------------------------------------------


async def test_the_graders_python_never_imports_the_work_dirs_copy_of_its_modules(
    sandbox: BwrapSandbox,
) -> None:
    await _sh(
        sandbox,
        "printf 'import sys\\nsys.exit(7)\\n' > /app/configparser.py; "
        "printf 'raise SystemExit(8)\\n' > /app/json.py; echo 'ANSWER = 42' > /app/solution.py",
    )
    check = (
        "cd /app && python3 - <<'PY'\n"
        "import configparser, json, solution\n"
        "print(configparser.__file__, json.__file__, solution.ANSWER)\n"
        "PY"
    )
    rc, out, err = await _sh(sandbox, check)  # the agent's own view: its modules win
    assert rc == 7, (rc, out, err)
    grading = {**GRADING_ENV, "HARNESS_GRADER_WORKDIR": "/app"}
    rc, out, err = await _sh(sandbox, check, **grading)
    assert rc == 0, (out, err)
    config_file, json_file, answer = out.split()
    assert config_file.startswith("/usr/lib/python3") and json_file.startswith("/usr/lib/"), out
    assert answer == "42", out  # the answer itself (a module only the work dir has) still loads


# ---- scratch space and toolchain config -------------------------------------------------------


async def test_scratch_and_root_toolchain_config_are_fresh_for_grading() -> None:
    box = BwrapSandbox(SandboxSpec(), name="scratch")
    await box.start()
    try:
        await _sh(box, "echo image > /tmp/from-image; echo '{\"a\": 1}' > /package.json")
        await box.prepare_grading(record_image=True, outputs=("/tmp/report",))
        await _sh(
            box,
            "echo agent > /tmp/planted; mkdir -p /var/tmp/x /tmp/report; echo r > /tmp/report/r; "
            'mkdir -p /node_modules/helper; echo \'{"type": "module"}\' > /package.json; '
            "echo x > /run/sock",
        )
        reset = await box.prepare_grading(outputs=("/tmp/report",))
        assert reset.evidence == [], reset  # scratch and toolchain resets are not tampering
        text = " | ".join(reset.reset)
        for what in ("/node_modules", "/package.json", "/tmp: 1 entries", "/var/tmp", "/run:"):
            assert what in text, text
        rc, out, err = await _sh(
            box, "ls -A /tmp; cat /package.json; ls /node_modules 2>&1; ls /run"
        )
        assert out.split()[:2] == ["from-image", "report"], out
        assert '{"a": 1}' in out and "No such file" in out, out
        assert "harness-supervisor" in out and "harness-grader-python" in out, out  # mounts kept
    finally:
        await box.stop()


def test_declared_outputs_are_read_and_checked(tmp_path: Path) -> None:
    toml = tmp_path / "task.toml"
    assert declared_outputs(toml) == ()
    toml.write_text('[metadata]\nharness_outputs = ["/tmp/out.csv", "/package.json"]\n')
    assert declared_outputs(toml) == ("/tmp/out.csv", "/package.json")
    for bad in ('"/tmp/x"', '["tmp/x"]', '["/tmp/../etc"]', '["/"]', "[1]"):
        toml.write_text(f"[metadata]\nharness_outputs = {bad}\n")
        with pytest.raises(SandboxDefinitionError, match="harness_outputs"):
            declared_outputs(toml)


# ---- pid 1 under a flood of connections --------------------------------------------------------


@pytest.fixture
def tcp_sink() -> Iterator[int]:
    """A host TCP listener that accepts and holds every connection (the proxy's stand-in)."""
    server = socket.create_server(("127.0.0.1", 0), backlog=4096)
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.close()


async def test_pid_1_outlives_a_flood_of_connections(tcp_sink: int) -> None:
    box = BwrapSandbox(SandboxSpec(forward={8123: ("127.0.0.1", tcp_sink)}), name="flood")
    await box.start()
    try:
        flood = (
            "import os, socket, time\n"
            "kids = []\n"
            "for k in range(4):\n"
            "    pid = os.fork()\n"
            "    if pid == 0:\n"
            "        socks = []\n"
            "        try:\n"
            "            for i in range(650):\n"
            "                s = socket.socket(); s.settimeout(5)\n"
            "                s.connect(('127.0.0.1', 8123)); socks.append(s)\n"
            "        except OSError:\n"
            "            pass\n"
            "        time.sleep(2)\n"
            "        print(len(socks), flush=True)\n"
            "        os._exit(0)\n"
            "    kids.append(pid)\n"
            "for pid in kids: os.waitpid(pid, 0)\n"
        )
        result = await box.exec(["python3", "-c", flood], timeout_s=120)
        assert sum(int(n) for n in result.stdout.split()) >= 2100, result
        assert box.running
        rc, out, _ = await _sh(box, "echo alive")  # pid 1 still serves commands
        assert out.strip() == "alive"
        # ... and new relays once the flood let go
        rc, out, err = await _sh(
            box,
            "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 8123)); "
            "print('relayed')\"",
        )
        assert out.strip() == "relayed", err
    finally:
        await box.stop()


# ---- pid 1's death and silence -----------------------------------------------------------------


async def test_a_dead_pid_1_is_reported_as_died_not_closed(sandbox: BwrapSandbox) -> None:
    assert sandbox.supervisor_pid is not None
    os.kill(sandbox.supervisor_pid, signal.SIGKILL)
    with pytest.raises(SandboxDiedError, match="pid 1 exited") as info:
        await sandbox.exec(["true"])
    assert sandbox_died(RuntimeError("wrapped")) is None
    wrapped = RuntimeError("the agent's exec failed")
    wrapped.__cause__ = info.value
    assert "pid 1 died" in (sandbox_died(wrapped) or "")
    with pytest.raises(SandboxDiedError):
        await sandbox.prepare_grading()


@pytest.mark.parametrize("in_flight", [True, False], ids=["during-a-command", "before-a-command"])
async def test_pid_1_dead_while_bwrap_is_slow_to_reap_it_is_still_reported_as_died(
    sandbox: BwrapSandbox, in_flight: bool
) -> None:
    # A loaded host: bwrap (stopped here) gets no CPU to reap its dead child for seconds. The
    # death must still be told apart from a channel error (a rollout's cause hangs on it).
    assert sandbox.supervisor_pid is not None and sandbox._proc is not None
    bwrap = sandbox._proc.pid
    command = asyncio.ensure_future(sandbox.exec(["sleep", "60"])) if in_flight else None
    await asyncio.sleep(0.3)
    os.kill(bwrap, signal.SIGSTOP)
    os.kill(sandbox.supervisor_pid, signal.SIGKILL)

    async def resume_later() -> None:
        await asyncio.sleep(3.0)  # longer than the old fixed 2 s wait
        os.kill(bwrap, signal.SIGCONT)

    resume = asyncio.ensure_future(resume_later())
    try:
        with pytest.raises(SandboxDiedError, match="pid 1 exited"):
            await asyncio.wait_for(command or sandbox.exec(["true"]), 30)
    finally:
        await resume
    assert sandbox._proc.poll() is not None


async def test_a_silent_pid_1_does_not_hang_grading(
    sandbox: BwrapSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_pid1_ops, "_OP_TIMEOUT_S", 1.0)
    assert sandbox.supervisor_pid is not None
    os.kill(sandbox.supervisor_pid, signal.SIGSTOP)
    try:
        with pytest.raises(SandboxExecError, match="did not answer"):
            await asyncio.wait_for(sandbox.prepare_grading(timeout_s=0.5), 30)
    finally:
        os.kill(sandbox.supervisor_pid, signal.SIGCONT)


async def test_a_start_failure_shows_the_sandboxs_own_log(tmp_path: Path) -> None:
    missing = tmp_path / "not-there"
    box = BwrapSandbox(SandboxSpec(ro_binds={str(missing): "/opt/x"}), name="nostart")
    with pytest.raises(SandboxStartError, match="not-there"):
        await box.start()


# ---- where pid 1's code is built ---------------------------------------------------------------


def test_the_build_cache_is_ours_alone_and_checked_at_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HARNESS_SANDBOX_DIR", str(tmp_path))
    supervisor_build._supervisor_build.cache_clear()
    supervisor_build._supervisor_sources.cache_clear()
    try:
        built = supervisor_build.compiled_supervisor()
        cache = supervisor_build.cache_dir()
        assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
        assert built.parent == cache and (built / "__pycache__").is_dir()
        assert supervisor_build.compiled_supervisor() == built  # reused as it is
        # Another hand changed pid 1's code: refused, never run.
        os.chmod(built / "supervisor.py", 0o644)
        (built / "supervisor.py").write_text("print('forged')\n")
        with pytest.raises(SandboxUnavailableError, match="differs from the source"):
            supervisor_build.compiled_supervisor()
        # A cache dir others may write to: refused.
        os.chmod(cache, 0o777)
        with pytest.raises(SandboxUnavailableError, match="writable by others"):
            supervisor_build.cache_dir()
    finally:
        supervisor_build._supervisor_build.cache_clear()
        supervisor_build._supervisor_sources.cache_clear()


def test_the_grader_site_rule_is_by_name_not_by_dir(tmp_path: Path) -> None:
    """grader_site.py under the host's Python: work dir copies of importable modules lose, the
    work dir's own modules load, a venv inside the work dir counts as the work dir's."""
    import subprocess
    import sys

    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_bytes(
        (Path(local.__file__).parent / "grader_site.py").read_bytes()
    )
    work = tmp_path / "app"
    (work / "lib").mkdir(parents=True)
    (work / "csv.py").write_text("raise SystemExit(9)\n")
    (work / "lib" / "answer_mod.py").write_text("VALUE = 'from the work dir'\n")
    (work / "solution.py").write_text("ANSWER = 42\n")
    code = (
        "import sys; sys.path.append({!r})\n"
        "import csv, solution, answer_mod\n"
        "print(csv.__file__.startswith(sys.base_prefix), solution.ANSWER, answer_mod.VALUE)\n"
    ).format(str(work / "lib"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site)}
    for extra in ({}, {"HARNESS_GRADER_WORKDIR": str(work)}):
        out = subprocess.run(
            [sys.executable, "-c", code],
            cwd=work,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", "42", "from", "the", "work", "dir"], out.stdout
    # Without the hook the planted csv.py runs: the test shows the attack, not a no-op.
    bare = subprocess.run(
        [sys.executable, "-c", "import csv"], cwd=work, env={"PATH": os.environ["PATH"]}
    )
    assert bare.returncode == 9
