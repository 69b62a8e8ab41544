# .venv/bin/python -m pytest tests/test_factory_causes.py -q
"""Every injected fault lands in its cause; nothing is lost; retries only where they are safe.

Real pieces: the bubblewrap sandbox, the capture proxy (in-process), Harbor's verifier and the
bundled hello-file task. Faked: the engine (capture.fake_engine: instant replies) and the agent,
a `HarnessAgent` whose CLI is a shell script, so each fault (crash, hang, lost session) is exact.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from typing import ClassVar

import httpx
import pytest

from capture.fake_engine import FakeEngine
from harness.agents.base import HarnessAgent
from harness.factory import HarborSessionFactory
from harness.session import SandboxBackend
from harness.tasks import BUNDLED_DIR

HELLO = BUNDLED_DIR / "hello-file"

# One engine call from inside the sandbox, with the standard library (the sandbox has python3).
CALL_PY = (
    "import json,os,urllib.request as u;"
    "r=u.Request(os.environ['ENDPOINT']+'/chat/completions',"
    "json.dumps({'model':'tiny','messages':[{'role':'user','content':'hi'}]}).encode(),"
    "{'Authorization':'Bearer '+os.environ['KEY'],'Content-Type':'application/json'});"
    "u.urlopen(r,timeout=30).read()"
)
CALL = 'python3 -c "$CALL_PY"'
SOLVE = "printf 'Hello, Harness!\\n' > /app/greeting.txt"


def script_agent(script: str, agent_name: str = "script") -> type[HarnessAgent]:
    """An agent class whose CLI is `sh -c script` (ENDPOINT/KEY/CALL_PY in its environment)."""

    class ScriptAgent(HarnessAgent):
        NAME: ClassVar[str] = agent_name
        DIALECT: ClassVar[str] = "chat"  # type: ignore[assignment]
        CLI: ClassVar[str] = "mini"
        HARBOR_AGENT: ClassVar[str] = "harbor.agents.nop:NopAgent"
        INSTALLED_BINARY: ClassVar[str] = "sh"

        @staticmethod
        def name() -> str:
            return agent_name

        def host_paths(self) -> list[Path]:
            return []

        def env(self) -> dict[str, str]:
            return {"ENDPOINT": self.endpoint_url, "KEY": self.api_key, "CALL_PY": CALL_PY}

        def command(self, instruction: str) -> list[str]:
            return ["/bin/sh", "-c", script]

    return ScriptAgent


@pytest.fixture(scope="module")
def fake_engine():
    with FakeEngine() as engine:
        yield engine


def make_factory(fake_engine, script: str, split=None, **kwargs) -> HarborSessionFactory:
    options = dict(
        split=split or [HELLO],
        harness=script_agent(script),
        llm_url=fake_engine.url,
        sampling={"temperature": 1.0},
        agent_timeout_s=30,
        max_attempts=3,
        backoff_s=0.01,
    )
    options.update(kwargs)
    return HarborSessionFactory(None, **options)


def rollout(factory: HarborSessionFactory, **kwargs):
    try:
        return asyncio.run(factory.rollout(**kwargs))
    finally:
        factory.close()


def task_copy(tmp_path: Path, *, test_sh: str | None = None, dockerfile: str | None = None) -> Path:
    """hello-file with its verifier script or Dockerfile replaced."""
    task = tmp_path / "task"
    shutil.copytree(HELLO, task)
    if test_sh is not None:
        (task / "tests" / "test.sh").write_text(test_sh)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    return task


def test_an_agent_that_solves_the_task_is_ok_with_reward_one_and_a_trace(fake_engine):
    result = rollout(make_factory(fake_engine, f"{CALL} && {SOLVE}"), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("ok", 1.0, 1)
    assert result.trace is not None and len(result.trace.turns) == 1
    assert result.outcome is not None and result.outcome.env_reward == 1.0
    assert {"sandbox_start", "agent_start", "agent_run", "verify", "teardown"} <= set(
        result.timings
    )


def test_an_agent_that_crashes_after_a_model_call_is_a_model_failure_not_retried(fake_engine):
    result = rollout(make_factory(fake_engine, f"{CALL}; exit 1"), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("model_failure", 0.0, 1)
    assert result.trace is not None


def test_an_agent_that_crashes_before_its_first_model_call_is_retried_then_infra(fake_engine):
    factory = make_factory(fake_engine, "echo boom >&2; exit 3")
    result = rollout(factory, seed=0)
    assert (result.cause, result.attempts, factory.retries) == ("infra_failure", 3, 2)
    assert "AgentStartError" in result.error and "boom" in result.error


def test_an_agent_that_hangs_past_its_timeout_is_a_timeout_with_its_turns_kept(fake_engine):
    factory = make_factory(fake_engine, f"{CALL}; sleep 600", agent_timeout_s=3)
    started = time.monotonic()
    result = rollout(factory, seed=0)
    assert result.cause == "timeout" and time.monotonic() - started < 30
    assert result.outcome is not None and result.outcome.timed_out is True
    assert result.trace is not None and len(result.trace.turns) == 1
    assert result.env_reward == 0.0  # the verifier still grades what the agent left behind


def test_a_sandbox_that_fails_to_start_is_retried_then_infra(fake_engine, tmp_path):
    task = task_copy(tmp_path, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN exit 7\n")
    factory = make_factory(fake_engine, SOLVE, split=[task])
    result = rollout(factory, seed=0)
    assert (result.cause, result.attempts) == ("infra_failure", 3)
    assert "SandboxStartError" in result.error


def test_a_verifier_that_writes_no_reward_is_a_verifier_failure(fake_engine, tmp_path):
    task = task_copy(tmp_path, test_sh="#!/bin/bash\necho 'graded nothing'\n")
    result = rollout(make_factory(fake_engine, f"{CALL} && {SOLVE}", split=[task]), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("verifier_failure", None, 1)
    assert "RewardMissingError" in result.error


def test_a_proxy_session_deleted_mid_run_is_an_infra_failure_not_retried(fake_engine):
    factory = make_factory(fake_engine, f"{CALL}; sleep 2; {CALL}")

    async def run():
        async def delete_after_first_call() -> None:
            headers = {"Authorization": f"Bearer {factory.proxy.admin_key}"}
            async with httpx.AsyncClient(base_url=factory.proxy.url, headers=headers) as admin:
                while True:
                    sessions = (await admin.get("/admin/sessions")).json()["sessions"]
                    called = [s for s in sessions if s.get("n_calls", 0) >= 1]
                    if called:
                        await admin.delete(f"/admin/sessions/{called[0]['session_id']}")
                        return
                    await asyncio.sleep(0.05)

        deleter = asyncio.create_task(delete_after_first_call())
        result = await factory.rollout(seed=0)
        await deleter
        return result

    try:
        result = asyncio.run(run())
    finally:
        factory.close()
    assert (result.cause, result.attempts) == ("infra_failure", 1)
    assert "ProxySessionLostError" in result.error


def test_counts_by_cause_add_up_to_every_rollout_returned(fake_engine):
    factory = make_factory(fake_engine, f"{CALL} && {SOLVE}", max_attempts=1)

    async def run():
        return await asyncio.gather(*(factory.rollout(seed=i) for i in range(3)))

    try:
        results = asyncio.run(run())
    finally:
        factory.close()
    assert sum(factory.counts.values()) == len(results) == 3
    assert factory.counts["ok"] == 3 and factory.metrics["rollouts/ok"] == 3


def test_a_selected_key_of_a_multi_reward_task_becomes_env_reward(fake_engine, tmp_path):
    rewards = {"correct": 1, "style": 0.25}
    task = task_copy(
        tmp_path,
        test_sh=(
            "#!/bin/bash\nmkdir -p /logs/verifier\n"
            f"echo '{json.dumps(rewards)}' > /logs/verifier/reward.json\n"
        ),
    )
    result = rollout(make_factory(fake_engine, CALL, split=[task], reward_key="style"), seed=0)
    assert result.rewards == {"correct": 1.0, "style": 0.25}
    assert (result.cause, result.env_reward) == ("ok", 0.25)


def test_a_reward_key_the_task_does_not_write_is_a_verifier_failure(fake_engine):
    result = rollout(make_factory(fake_engine, CALL, reward_key="style"), seed=0)
    assert result.cause == "verifier_failure" and "style" in result.error


def test_rollouts_of_one_seed_share_one_task_and_seeds_walk_the_split(fake_engine):
    factory = make_factory(fake_engine, CALL, split="bundled")
    try:
        names = [t.name for t in factory.tasks]
        assert factory.pick_task(seed=3).name == factory.pick_task(seed=3).name == names[3]
        assert factory.pick_task(seed=len(names) + 1).name == names[1]
        assert factory.pick_task("harness/csv-report", seed=3).name == "harness/csv-report"
        assert factory.pick_task({"prompt": "a TRL row naming no task"}, seed=2).name == names[2]
    finally:
        factory.close()


def test_no_more_than_max_concurrent_rollouts_run_at_once(fake_engine):
    live, peak = 0, 0
    from harness.factory import sandbox_backend

    local = sandbox_backend("local")

    def counting(request):
        env = local.make(request)
        start, stop = env.start, env.stop

        async def counted_start(force_build):
            nonlocal live, peak
            live += 1
            peak = max(peak, live)
            await start(force_build)

        async def counted_stop(delete):
            nonlocal live
            live -= 1
            await stop(delete)

        env.start, env.stop = counted_start, counted_stop
        return env

    factory = make_factory(
        fake_engine,
        f"{CALL}; sleep 1",
        max_concurrent_rollouts=2,
        sandbox=SandboxBackend(make=counting, agent_url=local.agent_url),
        preinstalled=True,
    )

    async def run():
        return await asyncio.gather(*(factory.rollout(seed=0) for _ in range(5)))

    try:
        results = asyncio.run(run())
    finally:
        factory.close()
    assert [r.cause for r in results] == ["model_failure"] * 5
    assert peak == 2 and live == 0
