# .venv/bin/python -m pytest tests/test_session_protocol.py -q
"""HarborSession speaks OpenEnv's session protocols (sync and async) and always cleans up.

Real sandbox, real proxy, Harbor's verifier; the engine is capture's fake and the agent a shell
script (see test_factory_causes.py), so every case is exact and fast.
"""

from __future__ import annotations

import asyncio
import glob
import os
import tempfile
import threading
import uuid

import httpx
import pytest
from openenv.core.harness.rollout import (
    LoopOwningSession,
    ResourceSession,
    ResourceSessionFactory,
    TrainableSession,
    VerifyResult,
)

from tests.helpers.sessions import CALL, SOLVE, make_factory
from tests.helpers.waiting import until


@pytest.fixture(scope="module")
def fake_engine():
    from capture.fake_engine import FakeEngine

    with FakeEngine() as engine:
        yield engine


def _proxy_sessions(factory) -> list[dict]:
    headers = {"Authorization": f"Bearer {factory.proxy.admin_key}"}
    return httpx.get(f"{factory.proxy.url}/admin/sessions", headers=headers).json()["sessions"]


def _processes_with(marker: str) -> list[int]:
    pids = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline, "rb") as handle:
                if marker.encode() in handle.read():
                    pids.append(int(cmdline.split("/")[2]))
        except OSError:
            continue
    return [p for p in pids if p != os.getpid()]


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return int(handle.read().rsplit(b")", 1)[1].split()[1])  # after "(comm)": state, ppid
    except (OSError, IndexError, ValueError):
        return None


def _sandboxes_running(marker: str) -> list[int]:
    """One process per sandbox whose command runs: the outermost process with the marker.

    A shell's forked child carries the shell's command line until it execs, and bwrap's inner
    process carries the outer one's, so one sandbox shows the marker in several processes, some of
    them for a moment: counting those counted a sandbox twice, then once."""
    pids = set(_processes_with(marker))
    return sorted(p for p in pids if _parent(p) not in pids)


def _trial_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "harness-harness-hello-file-*")))


def test_the_factory_is_an_openenv_resource_session_factory(fake_engine):
    factory = make_factory(fake_engine, CALL)
    try:
        assert isinstance(factory, ResourceSessionFactory)
    finally:
        factory.close()


def test_a_session_driven_through_the_sync_api_from_a_worker_thread_runs_to_a_reward(fake_engine):
    # TRL 1.16's HarnessRolloutWorker: create, wait_for_completion, fetch_training_trace,
    # verify(completion), close -- all sync, from a pool thread.
    factory = make_factory(fake_engine, f"{CALL} && {SOLVE}")
    box: dict = {}

    def worker() -> None:
        session = factory.create({"prompt": "row"}, seed=0, episode_id="ep-1")
        try:
            box["protocols"] = (
                isinstance(session, TrainableSession),
                isinstance(session, LoopOwningSession),
                isinstance(session, ResourceSession),
            )
            box["exit"] = session.wait_for_completion()
            box["trace"] = session.fetch_training_trace()
            box["verify"] = session.verify([])
        finally:
            session.close()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=120)
    try:
        assert box["protocols"] == (True, True, True)
        assert box["exit"] == 0 and len(box["trace"].turns) == 1
        assert isinstance(box["verify"], VerifyResult) and box["verify"].env_reward == 1.0
        assert _proxy_sessions(factory) == []
    finally:
        factory.close()


def test_wait_past_the_timeout_raises_a_builtin_timeout_error_as_trl_expects(fake_engine):
    factory = make_factory(fake_engine, "sleep 600")
    session = factory.create(seed=0)
    try:
        with pytest.raises(TimeoutError):
            session.wait_for_completion(timeout_s=1)
        assert session.timed_out
    finally:
        session.close()
        factory.close()


def test_close_twice_is_harmless_and_leaves_no_proxy_session_or_trial_dir(fake_engine):
    factory = make_factory(fake_engine, CALL)
    before = _trial_dirs()

    async def run() -> None:
        session = await factory.a_create(seed=0)
        await session.a_wait_for_completion()
        await session.a_close()
        await session.a_close()

    try:
        asyncio.run(run())
        assert _proxy_sessions(factory) == []
        assert _trial_dirs() - before == set()
    finally:
        factory.close()


def test_a_sync_method_called_on_the_sessions_own_loop_refuses_instead_of_deadlocking(fake_engine):
    factory = make_factory(fake_engine, CALL)

    async def run() -> None:
        session = await factory.a_create(seed=0)
        try:
            with pytest.raises(RuntimeError, match="a_\\* twin"):
                session.wait_for_completion()
        finally:
            await session.a_close()

    try:
        asyncio.run(run())
    finally:
        factory.close()


def test_cancelling_eight_running_rollouts_leaves_no_process_proxy_session_or_trial_dir(
    fake_engine,
):
    marker = f"harness-cancel-{uuid.uuid4().hex}"
    factory = make_factory(
        fake_engine, f"{CALL}; sleep 600 # {marker}", max_concurrent_rollouts=8, agent_timeout_s=600
    )
    before = _trial_dirs()

    async def run() -> tuple[int, int]:
        tasks = [asyncio.create_task(factory.rollout(seed=0)) for _ in range(8)]
        # Eight sandboxes start and eight agents make their call: ~10 s on a quiet machine, more
        # than 20 s beside another test run (issue 14), so this waits on the count, not a window.
        await until(lambda: len(_sandboxes_running(marker)) >= 8, "all eight agents running",
                    state=lambda: f"{len(_sandboxes_running(marker))} sandboxes run their command")
        running = len(_sandboxes_running(marker))
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        cancelled = sum(isinstance(o, asyncio.CancelledError) for o in outcomes)
        return running, cancelled

    try:
        running, cancelled = asyncio.run(run())
        assert running >= 8 and cancelled == 8
        assert _processes_with(marker) == []
        assert _proxy_sessions(factory) == []
        assert _trial_dirs() - before == set()
    finally:
        factory.close()
