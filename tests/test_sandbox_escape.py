# Run: .venv/bin/python -m pytest tests/test_sandbox_escape.py -x -q
"""Each test adversarially checks one property of the local bubblewrap sandbox (real bwrap).

The agent's view is a command run inside the sandbox; the property is checked from the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from harness.service.sandboxes import (
    BwrapSandbox,
    SandboxExecTimeoutError,
    SandboxLimits,
    SandboxSpec,
    process_cap_mode,
    sandbox_url,
    url_forward,
)
from harness.tasks import BUNDLED_DIR
from launchers.paths import REPO_ROOT
from tests.helpers.http_stub import serving
from tests.helpers.waiting import until


@pytest.fixture
async def sandbox() -> AsyncIterator[BwrapSandbox]:
    box = BwrapSandbox(SandboxSpec(), name="escape")
    await box.start()
    try:
        yield box
    finally:
        await box.stop()


@pytest.fixture
def http_server() -> Iterator[str]:
    """A real HTTP server on a host loopback port, standing in for the capture proxy."""
    with serving(b"proxy says hi") as port:
        yield f"http://127.0.0.1:{port}"


def _host_pids_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (zombies have none, so they don't count)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


async def _sh(box: BwrapSandbox, command: str, **kwargs) -> tuple[int, str, str]:
    result = await box.shell(command, **kwargs)
    return result.return_code, result.stdout.decode(), result.stderr.decode()


async def test_task_tests_are_not_visible_inside_before_the_verifier_uploads_them() -> None:
    task_dir = BUNDLED_DIR / "fix-python-function"
    box = BwrapSandbox(SandboxSpec(seed={"/app": task_dir / "environment"}), name="notests")
    await box.start()
    try:
        found = await _sh(
            box,
            f"ls /tests 2>&1; ls {task_dir} 2>&1; "
            "find / -xdev -name 'test_stats.py' -not -path '/proc/*' 2>/dev/null; true",
        )
    finally:
        await box.stop()
    # The seeded environment files are there, the tests are nowhere.
    assert "test_stats.py" not in found[1]
    assert "No such file or directory" in found[1]


@pytest.mark.parametrize(
    "target",
    ["/usr/harness-escape", "/etc/harness-escape", "/usr/bin/harness-escape"],
)
async def test_host_system_dirs_are_read_only_inside(sandbox: BwrapSandbox, target: str) -> None:
    rc, _, err = await _sh(sandbox, f"echo pwned > {target}")
    assert rc != 0 and "Read-only file system" in err
    assert not Path(target).exists()


@pytest.mark.parametrize("host_dir", [REPO_ROOT, Path.home(), Path("/tmp")])
async def test_writes_to_host_paths_never_reach_the_host(
    sandbox: BwrapSandbox, host_dir: Path
) -> None:
    # Inside, these paths are either absent or part of the private root: a write lands there.
    marker = host_dir / f"harness-escape-{os.getpid()}"
    await _sh(sandbox, f"mkdir -p {host_dir} && echo pwned > {marker}")
    assert not marker.exists()


async def test_read_only_binds_cannot_be_written(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "agent").write_text("original")
    box = BwrapSandbox(SandboxSpec(ro_binds={str(tools): "/opt/tools"}), name="robind")
    await box.start()
    try:
        rc, _, err = await _sh(box, "echo pwned > /opt/tools/agent; rm -f /opt/tools/agent")
    finally:
        await box.stop()
    assert rc != 0 and "Read-only file system" in err
    assert (tools / "agent").read_text() == "original"


async def test_root_only_files_of_host_etc_are_masked(sandbox: BwrapSandbox) -> None:
    if not Path("/etc/shadow").exists():
        pytest.skip("this host has no /etc/shadow to mask")
    # Masked by a read-only bind of /dev/null (bwrap binds nodev, so opening it even fails).
    _, out, _ = await _sh(sandbox, "cat /etc/shadow /etc/gshadow 2>&1")
    assert "root:" not in out


async def test_host_environment_secrets_are_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_FAKE_SECRET", "s3cr3t-value-123")
    box = BwrapSandbox(SandboxSpec(), name="secrets")
    await box.start()
    try:
        _, out, _ = await _sh(box, "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'")
    finally:
        await box.stop()
    assert "s3cr3t-value-123" not in out
    assert "HARNESS_FAKE_SECRET" not in out


async def test_commands_run_without_capabilities_and_with_no_new_privs(
    sandbox: BwrapSandbox,
) -> None:
    _, out, _ = await _sh(sandbox, "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs)' /proc/self/status")
    fields = dict(line.split(":\t") for line in out.strip().splitlines())
    assert fields["CapEff"] == fields["CapPrm"] == fields["CapBnd"] == "0000000000000000"
    assert fields["NoNewPrivs"] == "1"


@pytest.mark.parametrize("address", ["1.1.1.1:53", "10.0.0.1:80", "8.8.8.8:443"])
async def test_non_loopback_addresses_are_unreachable(sandbox: BwrapSandbox, address: str) -> None:
    host, port = address.split(":")
    script = (
        "import socket; s = socket.socket(); s.settimeout(3)\n"
        f"try:\n s.connect(('{host}', {port})); print('CONNECTED')\n"
        "except OSError as e: print('refused', e)"
    )
    _, out, _ = await _sh(sandbox, f'python3 -c "{script}"')
    assert "CONNECTED" not in out and "refused" in out


async def test_host_loopback_ports_other_than_the_forwarded_one_are_unreachable(
    http_server: str,
) -> None:
    # Forward some other port; the real server on the host's loopback must stay out of reach.
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    forward = {other.getsockname()[1]: ("127.0.0.1", other.getsockname()[1])}
    other.close()
    box = BwrapSandbox(SandboxSpec(forward=forward), name="ports")
    await box.start()
    try:
        port = http_server.rsplit(":", 1)[1]
        script = (
            "import socket; s = socket.socket(); s.settimeout(3)\n"
            f"try:\n s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
            "except OSError as e: print('refused', e)"
        )
        _, out, _ = await _sh(box, f'python3 -c "{script}"')
    finally:
        await box.stop()
    assert "CONNECTED" not in out and "refused" in out


async def test_the_forwarded_proxy_port_is_reachable_on_sandbox_loopback(http_server: str) -> None:
    # The positive control for the two tests above: the proxy's own port does work.
    box = BwrapSandbox(SandboxSpec(forward=url_forward(http_server)), name="proxy")
    await box.start()
    try:
        url = sandbox_url(http_server + "/s/abc/v1/models")
        _, out, err = await _sh(
            box, f"python3 -c \"import urllib.request as u; print(u.urlopen('{url}').read())\""
        )
    finally:
        await box.stop()
    assert "proxy says hi" in out, err


async def test_stop_kills_every_process_the_sandbox_started() -> None:
    box = BwrapSandbox(SandboxSpec(), name="reaper")
    await box.start()
    # A detached background sleeper, in its own session, that outlives the command.
    await _sh(box, "setsid nohup sleep 4321.5 >/dev/null 2>&1 & sleep 6543.5 & echo started")
    for marker in ("sleep 4321.5", "sleep 6543.5"):
        await until(lambda m=marker: len(_host_pids_with(m)) == 1, f"one `{marker}` running",
                    state=lambda m=marker: _host_pids_with(m))
    private_dir = box.dir
    await box.stop()
    assert _host_pids_with("sleep 4321.5") == []
    assert _host_pids_with("sleep 6543.5") == []
    assert private_dir is not None and not private_dir.exists()


async def test_exec_timeout_kills_the_command_and_its_children(sandbox: BwrapSandbox) -> None:
    with pytest.raises(SandboxExecTimeoutError) as info:
        await sandbox.shell("sleep 777.25 & sleep 778.5; echo never", timeout_s=1)
    assert info.value.timeout_s == 1
    await until(lambda: _host_pids_with("sleep 777.25") == _host_pids_with("sleep 778.5") == [],
                "the timed-out command's processes to be gone",
                state=lambda: _host_pids_with("sleep 77"))
    # The sandbox itself survives a timed-out command.
    assert (await _sh(sandbox, "echo alive"))[1] == "alive\n"


async def test_a_cancelled_exec_kills_its_command(sandbox: BwrapSandbox) -> None:
    task = asyncio.create_task(sandbox.shell("sleep 888.75"))
    await until(lambda: _host_pids_with("sleep 888.75"), "the command to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: _host_pids_with("sleep 888.75") == [], "the cancelled command to die",
                state=lambda: _host_pids_with("sleep 888.75"))


async def test_file_size_limit_stops_a_runaway_write() -> None:
    box = BwrapSandbox(SandboxSpec(limits=SandboxLimits(max_file_size_mb=1)), name="fsize")
    await box.start()
    try:
        rc, _, _ = await _sh(box, "head -c 3000000 /dev/zero > /app/big")
        _, size, _ = await _sh(box, "stat -c %s /app/big")
    finally:
        await box.stop()
    assert rc != 0
    assert int(size) <= 1024 * 1024


async def test_process_limit_caps_a_fork_bomb() -> None:
    mode, reason = process_cap_mode()
    if mode == "rlimit-only" and os.geteuid() == 0:
        pytest.skip(f"no process cap can bind root here: {reason}")
    box = BwrapSandbox(SandboxSpec(limits=SandboxLimits(max_processes=40)), name="forkbomb")
    await box.start()
    try:
        await _sh(box, "for i in $(seq 100); do sleep 999.125 & done 2>/dev/null; true")
        running = len(_host_pids_with("sleep 999.125"))
    finally:
        await box.stop()
    # 40 processes in all, the supervisor and the shell among them.
    assert 0 < running < 40


async def test_an_agent_symlink_cannot_redirect_an_upload_to_the_host(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    payload = tmp_path / "tests"
    payload.mkdir()
    (payload / "test.sh").write_text("echo graded\n")
    box = BwrapSandbox(SandboxSpec(), name="symlink")
    await box.start()
    try:
        await _sh(box, f"mkdir -p {victim} && ln -s {victim} /tests")
        with contextlib.suppress(Exception):  # failing is fine; writing to the host is not
            await box.put_dir(payload, "/tests")
    finally:
        await box.stop()
    assert list(victim.iterdir()) == []


async def test_an_agent_killing_everything_it_can_does_not_take_the_sandbox_down(
    sandbox: BwrapSandbox,
) -> None:
    # `kill -9 -1` and `pkill python3` from inside reach every process except pid 1, which is
    # the supervisor: the next command (e.g. the verifier) must still run.
    await _sh(sandbox, "pkill -9 python3; kill -9 -1; kill -INT 1; kill -TERM 1; true")
    assert (await _sh(sandbox, "echo still here"))[1] == "still here\n"


async def test_memory_limit_kills_an_oversized_allocation() -> None:
    box = BwrapSandbox(SandboxSpec(limits=SandboxLimits(memory_mb=64)), name="memory")
    await box.start()
    try:
        if "memory" not in box.enforced_limits:
            pytest.skip(f"no writable memory cgroup here; in force: {box.enforced_limits}")
        rc, out, _ = await _sh(box, "python3 -c 'x = bytearray(300 << 20); print(len(x))'")
        small = await _sh(box, "python3 -c 'x = bytearray(8 << 20); print(len(x))'")
    finally:
        await box.stop()
    assert rc == 128 + 9 and out == ""  # SIGKILLed by the OOM killer
    assert small[0] == 0


def test_a_sandbox_started_in_one_event_loop_runs_and_stops_from_others() -> None:
    # Sync session code drives each step with its own asyncio.run(); nothing may leak.
    box = BwrapSandbox(SandboxSpec(), name="loops")
    asyncio.run(box.start())
    out = asyncio.run(box.shell("sleep 5432.5 & echo up"))
    assert out.stdout == b"up\n" and _host_pids_with("sleep 5432.5")
    asyncio.run(box.stop())
    assert _host_pids_with("sleep 5432.5") == [] and box.dir is not None and not box.dir.exists()


def test_stop_sync_kills_and_cleans_up_without_an_event_loop() -> None:
    box = BwrapSandbox(SandboxSpec(), name="sync")
    asyncio.run(box.start())
    asyncio.run(box.shell("sleep 5433.5 &"))
    box.stop_sync()
    assert _host_pids_with("sleep 5433.5") == [] and box.dir is not None and not box.dir.exists()


async def test_commands_inherit_no_descriptor_but_their_stdio(sandbox: BwrapSandbox) -> None:
    # The supervisor's control socket in a command would let it answer the verifier's exec.
    _, out, _ = await _sh(sandbox, "ls /proc/self/fd")
    assert sorted(int(fd) for fd in out.split()) == [0, 1, 2, 3]  # 3: ls's own dir handle


async def test_commands_cannot_ptrace_or_inspect_the_supervisor(sandbox: BwrapSandbox) -> None:
    script = (
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True)\n"
        "print('ptrace', libc.ptrace(16, 1, 0, 0), ctypes.get_errno())\n"  # PTRACE_ATTACH
        "try:\n os.readlink('/proc/1/fd/0'); print('readlink ok')\n"
        "except OSError as e: print('readlink', e.errno)"
    )
    _, out, err = await _sh(sandbox, f'python3 -c "{script}"')
    assert "ptrace -1 1" in out, err  # EPERM
    assert "readlink 13" in out  # EACCES


async def test_kill_processes_ends_agent_leftovers_before_grading(sandbox: BwrapSandbox) -> None:
    # A leftover that would rewrite the reward after the verifier ran.
    await _sh(
        sandbox,
        "setsid sh -c 'while true; do echo 1 > /logs/verifier/reward.txt; sleep 0.05; done' "
        ">/dev/null 2>&1 & setsid nohup sleep 9876.5 >/dev/null 2>&1 & true",
    )
    # Both leftovers running before the kill: `&` returns before they exec (a loaded machine
    # showed the kill racing the start).
    for marker in ("sleep 9876.5", "reward.txt; sleep 0.05"):
        await until(lambda m=marker: _host_pids_with(m), f"the leftover {marker!r} to start")
    await sandbox.kill_processes()
    assert _host_pids_with("sleep 9876.5") == []
    await _sh(sandbox, "rm -f /logs/verifier/reward.txt; sleep 0.3")
    assert (await _sh(sandbox, "ls /logs/verifier"))[1] == ""


async def test_filling_the_private_root_is_no_space_for_the_writer_not_an_oom() -> None:
    # The root is a tmpfs (RAM charged to the sandbox's memory cgroup) capped at half the
    # memory cap: 256 MiB of memory -> 128 MiB of disk (the root and /dev/shm together). A
    # runaway write gets ENOSPC, and the sandbox, and so the verifier, keeps working.
    limits = SandboxLimits(memory_mb=256, disk_mb=4096)
    assert limits.disk_bytes() == 128 << 20
    assert limits.root_size_bytes() + limits.shm_size_bytes() == 128 << 20
    box = BwrapSandbox(SandboxSpec(limits=limits), name="fill")
    await box.start()
    try:
        rc, _, err = await _sh(box, "head -c 200000000 /dev/zero > /app/fill")
        _, size, _ = await _sh(box, "stat -c %s /app/fill")
        after = await _sh(box, "rm /app/fill && echo grading still works")
    finally:
        await box.stop()
    assert rc != 0 and "No space left on device" in err
    assert int(size) <= 128 << 20
    assert after[1] == "grading still works\n"


async def test_the_forwarded_port_also_answers_on_localhost_and_ipv6_loopback(
    http_server: str,
) -> None:
    # Node resolves "localhost" to ::1 first; an agent given a localhost URL must still work.
    box = BwrapSandbox(SandboxSpec(forward=url_forward(http_server)), name="v6")
    await box.start()
    port = http_server.rsplit(":", 1)[1]
    try:
        _, out, err = await _sh(
            box,
            f"node -e \"fetch('http://localhost:{port}/').then(r => r.text())"
            f".then(t => console.log(t))\"; python3 -c \"import urllib.request as u; "
            f"print(u.urlopen('http://[::1]:{port}/').read().decode())\"",
        )
    finally:
        await box.stop()
    assert out.splitlines() == ["proxy says hi", "proxy says hi"], err
