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
from harness.service.session import SandboxBackend
from tests.helpers.attacks import REWRITING_DAEMON, RecordingEnvironment, attack_first_backend
from tests.helpers.sessions import CALL, HELLO, SOLVE, make_factory, run_rollout
from tests.helpers.waiting import until


@pytest.fixture(scope="module")
def fake_engine():
    with FakeEngine() as engine:
        yield engine


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
    result = run_rollout(make_factory(fake_engine, f"{CALL} && {SOLVE}"), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("ok", 1.0, 1)
    assert result.trace is not None and len(result.trace.turns) == 1
    assert result.outcome is not None and result.outcome.env_reward == 1.0
    assert {"sandbox_start", "agent_start", "agent_run", "verify", "teardown"} <= set(
        result.timings
    )


def test_an_agent_that_crashes_after_a_model_call_is_a_model_failure_not_retried(fake_engine):
    result = run_rollout(make_factory(fake_engine, f"{CALL}; exit 1"), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("model_failure", 0.0, 1)
    assert result.trace is not None


def test_an_agent_that_crashes_before_its_first_model_call_is_retried_then_infra(fake_engine):
    factory = make_factory(fake_engine, "echo boom >&2; exit 3")
    result = run_rollout(factory, seed=0)
    assert (result.cause, result.attempts, factory.retries) == ("infra_failure", 3, 2)
    assert "AgentStartError" in result.error and "boom" in result.error


def test_an_agent_that_hangs_past_its_timeout_is_a_timeout_with_its_turns_kept(fake_engine):
    factory = make_factory(fake_engine, f"{CALL}; sleep 600", agent_timeout_s=3)
    started = time.monotonic()
    result = run_rollout(factory, seed=0)
    # cut at its 3 s timeout, not after its 600 s sleep (the rest is sandbox and verifier time)
    assert result.cause == "timeout" and time.monotonic() - started < 300
    assert result.outcome is not None and result.outcome.timed_out is True
    assert result.trace is not None and len(result.trace.turns) == 1
    assert result.env_reward == 0.0  # the verifier still grades what the agent left behind


def test_a_sandbox_that_fails_to_start_is_retried_then_infra(fake_engine, tmp_path):
    task = task_copy(tmp_path, dockerfile="FROM ubuntu:24.04\nWORKDIR /app\nRUN exit 7\n")
    factory = make_factory(fake_engine, SOLVE, split=[task])
    result = run_rollout(factory, seed=0)
    assert (result.cause, result.attempts) == ("infra_failure", 3)
    assert "SandboxStartError" in result.error


def test_a_verifier_that_writes_no_reward_is_a_verifier_failure(fake_engine, tmp_path):
    task = task_copy(tmp_path, test_sh="#!/bin/bash\necho 'graded nothing'\n")
    result = run_rollout(make_factory(fake_engine, f"{CALL} && {SOLVE}", split=[task]), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("verifier_failure", None, 1)
    assert "RewardMissingError" in result.error


def test_a_proxy_session_deleted_mid_run_is_an_infra_failure_not_retried(fake_engine):
    # The agent calls until a call fails: the test deletes its session after the first one,
    # whenever that lands (a fixed pause between two calls was a window a loaded machine misses).
    factory = make_factory(fake_engine, f"{CALL}; while {CALL} 2>/dev/null; do sleep 0.2; done")

    async def run():
        async def delete_after_first_call() -> None:
            headers = {"Authorization": f"Bearer {factory.proxy.admin_key}"}
            async with httpx.AsyncClient(base_url=factory.proxy.url, headers=headers) as admin:

                async def called() -> list[dict]:
                    sessions = (await admin.get("/admin/sessions")).json()["sessions"]
                    return [s for s in sessions if s.get("n_calls", 0) >= 1]

                first = await until(called, "a session with its first call")
                await admin.delete(f"/admin/sessions/{first[0]['session_id']}")

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
    result = run_rollout(make_factory(fake_engine, CALL, split=[task], reward_key="style"), seed=0)
    assert result.rewards == {"correct": 1.0, "style": 0.25}
    assert (result.cause, result.env_reward) == ("ok", 0.25)


def test_a_reward_key_the_task_does_not_write_is_a_verifier_failure(fake_engine):
    result = run_rollout(make_factory(fake_engine, CALL, reward_key="style"), seed=0)
    assert result.cause == "verifier_failure" and "style" in result.error


def test_rollouts_of_one_seed_share_one_task_and_seeds_walk_the_split(fake_engine):
    factory = make_factory(fake_engine, CALL, split="bundled")
    try:
        names = [t.name for t in factory.tasks]
        assert factory.pick_task(seed=3).name == factory.pick_task(seed=3).name == names[3]
        assert factory.pick_task(seed=len(names) + 1).name == names[1]
        assert factory.pick_task("harness/csv-report", seed=3).name == "harness/csv-report"
        assert factory.pick_task({"prompt": "a TRL row naming no task"}, seed=2).name == names[2]
        for stranger in ("harness/no-such-task", {"task": "no-such-task"}):
            with pytest.raises(ValueError, match="no-such-task.*not in this factory's split"):
                factory.pick_task(stranger, seed=2)  # never the seed's task under another name
    finally:
        factory.close()


def test_no_more_than_max_concurrent_rollouts_run_at_once(fake_engine):
    live, peak = 0, 0
    from harness.service.factory import sandbox_backend

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


# ---- causes the agent cannot dodge (issue 15): tampering, engine failures, the step limit -------


def test_a_pre_written_locked_reward_is_tampered_scored_zero_and_trainable(fake_engine):
    # The policy writes a passing grade and locks the reward folder: once this made the rollout
    # a verifier_failure, left out of the group baseline (failing that way cost nothing).
    lock = "echo 1 > /logs/verifier/reward.txt && chmod 555 /logs/verifier"
    result = run_rollout(make_factory(fake_engine, f"{CALL} && {lock}"), seed=0)
    assert (result.cause, result.env_reward, result.attempts) == ("tampered", 0.0, 1)
    assert "/logs/verifier was locked" in result.error and "reward.txt" in result.error
    assert result.trainable and result.outcome is not None and result.outcome.env_reward == 0.0


def test_a_daemon_left_to_rewrite_the_tests_earns_nothing(fake_engine):
    # The other attack of the issue (reward 1.0, cause ok, before): killed before grading.
    # The grader runs only once the reset has killed the daemon or the daemon has acted
    # (tests/helpers/attacks.py): with the reset removed the attack wins, and this test fails, every time.
    made_before = set(RecordingEnvironment.made)
    result = run_rollout(make_factory(fake_engine, f"{CALL} && {REWRITING_DAEMON}",
                                      sandbox=attack_first_backend(), preinstalled=True), seed=0)
    # The reset's evidence first: it found the daemon alive and killed it before grading.
    resets = [r for key, env in RecordingEnvironment.made.items() if key not in made_before
              for r in env.grading_resets]
    assert any(r.killed >= 1 for r in resets), resets
    assert (result.cause, result.env_reward) == ("model_failure", 0.0)


HOOKED = (  # a grader that runs code the agent controls (as real graders import the agent's code)
    "#!/bin/bash\nmkdir -p /logs/verifier\n[ -f /app/hook.sh ] && . /app/hook.sh\n"
    "echo 0 > /logs/verifier/reward.txt\n"
)


def test_agent_code_that_kills_the_grader_is_tampered(fake_engine, tmp_path):
    task = task_copy(tmp_path, test_sh=HOOKED)
    hook = "echo 'kill -9 $$' > /app/hook.sh"
    result = run_rollout(make_factory(fake_engine, f"{CALL} && {hook}", split=[task]), seed=0)
    assert (result.cause, result.env_reward) == ("tampered", 0.0)
    assert "killed by signal 9" in result.error


def test_agent_code_that_hangs_the_grader_is_tampered_by_the_control_run(fake_engine, tmp_path):
    # The grader times out after this agent but grades a fresh sandbox of the task: the agent's.
    task = task_copy(tmp_path, test_sh=HOOKED)
    hook = "echo 'sleep 600' > /app/hook.sh"
    factory = make_factory(fake_engine, f"{CALL} && {hook}", split=[task], verifier_timeout_s=3)
    result = run_rollout(factory, seed=0)
    assert (result.cause, result.env_reward) == ("tampered", 0.0)
    assert "grades a fresh sandbox" in result.error
    assert factory.config.grader_checks == {str(task): True}


def test_engine_failures_the_proxy_recorded_are_an_infra_failure(fake_engine):
    # The agent shrugs off a failed call and finishes: its run is still no sample of the policy.
    fake_engine.fault = "http500"
    try:
        result = run_rollout(make_factory(fake_engine, f"{CALL}; {SOLVE}"), seed=0)
    finally:
        fake_engine.fault = None
    assert (result.cause, result.attempts) == ("infra_failure", 1)
    assert "EngineFailureError" in result.error and "engine_http_error" in result.error


def test_reaching_the_step_limit_sets_timed_out(fake_engine):
    result = run_rollout(make_factory(fake_engine, f"{CALL} && {CALL} && {SOLVE}", max_steps=2), seed=0)
    # solved at its step limit: "ok" (a step limit is no clock), but cut short for a reward fn
    assert result.cause == "ok" and result.env_reward == 1.0
    assert result.outcome is not None and result.outcome.timed_out is True


def test_the_trainer_scores_a_tampered_rollout_zero_inside_its_group(fake_engine):
    # Whatever the reward functions say (this one pays 1.0 for anything), a tampered rollout
    # counts 0.0 in its group's baseline and trains with a negative advantage.
    from trainer.groups import prepare_group
    from trainer.rewards import RewardFunc

    lock = "echo 1 > /logs/verifier/reward.txt && chmod 555 /logs/verifier"
    honest = run_rollout(make_factory(fake_engine, f"{CALL} && {SOLVE}"), seed=0)
    tampered = run_rollout(make_factory(fake_engine, f"{CALL} && {SOLVE} && {lock}"), seed=0)
    assert (honest.cause, tampered.cause) == ("ok", "tampered")
    group = prepare_group(
        [honest, tampered],
        group_index=0,
        reward_funcs=[RewardFunc("pays_anything", lambda outcome: 1.0)],
        scale_rewards=False,
        dispatch_version=0,
    )
    assert group.rewards == [1.0, 0.0] and group.skipped is None
    assert [r["advantage"] for r in group.per_rollout] == [0.5, -0.5]
    assert group.causes == {"ok": 1, "tampered": 1}


class ExecOnly:
    """A Harbor environment seen as the session sees docker, e2b, modal or daytona: no
    `prepare_grading`, so the session resets grading through `exec` (harness/service/sandboxes/grading.py).
    The local sandbox does the work underneath; its own reset finds nothing left after ours."""

    resets: ClassVar[list[str]] = []  # the grading-reset scripts the session ran through exec

    def __init__(self, env):
        self._env = env

    async def exec(self, command, *args, **kwargs):
        if " reset --keep " in command:  # the reset helper's command line (grading.py)
            ExecOnly.resets.append(command)
        return await self._env.exec(command, *args, **kwargs)

    def __getattr__(self, name):
        if name == "prepare_grading":
            raise AttributeError(name)
        return getattr(self._env, name)


def test_an_exec_only_backend_gets_the_same_causes(fake_engine):
    from harness.service.factory import sandbox_backend

    local = sandbox_backend("local")
    backend = SandboxBackend(make=lambda r: ExecOnly(local.make(r)), agent_url=local.agent_url)
    lock = "echo 1 > /logs/verifier/reward.txt && chmod 555 /logs/verifier"
    daemon = "setsid sh -c 'while :; do sleep 0.01; done' >/dev/null 2>&1 </dev/null &"
    result = run_rollout(
        make_factory(fake_engine, f"{CALL} && {daemon} {lock}", sandbox=backend, preinstalled=True),
        seed=0,
    )
    assert (result.cause, result.env_reward) == ("tampered", 0.0)
    assert "/logs/verifier was locked (mode 555)" in result.error
    assert "held 1 entries: reward.txt" in result.error
    assert len(ExecOnly.resets) == 1  # found by the exec-only reset, not the local sandbox's
