# .venv/bin/python -m pytest tests/test_rollout_service.py -q
"""Rollouts as a service: `python -m harness.serve` processes and the trainer's client.

Real pieces: the service processes (each its own cache, data and temp dirs), their capture
proxies, bubblewrap sandboxes, mini-swe-agent and Harbor's verifier on the bundled hello-file
task. The engine is scripted (harness/audit/scripted_engine.py), one per service, so what the model says is
fixed and a service's model call can be held open on purpose: that is how a rollout is caught
mid-run when its service is killed. The training run with vLLM and the CPU weight sync is
tests/test_service_train_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import httpx
import pytest

from harness.audit.scripted_engine import ScriptedEngine, shell_task
from harness.client.remote import RemoteSessionFactory
from harness.tasks import BUNDLED_DIR
from launchers.paths import REPO_ROOT
from tests.helpers.service import start_service

pytestmark = [pytest.mark.agents]

HELLO = str(BUNDLED_DIR / "hello-file")
SOLVE = "printf 'Hello, Harness!\\n' > /app/greeting.txt"
SCRIPT = shell_task(SOLVE, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", final="Done.")
KEY = "test-service-key"
OPTIONS = dict(harness="mini-swe-agent", model="tiny", sampling={"temperature": 1.0},
               max_tokens=256, max_steps=4, agent_timeout_s=120, verifier_timeout_s=60,
               max_attempts=1)


def make_client(urls: list[str], **kwargs) -> RemoteSessionFactory:
    return RemoteSessionFactory(urls, KEY, **{**OPTIONS, **kwargs})


def test_two_services_share_rollouts_and_a_killed_one_costs_only_its_own(tiny_model_path,
                                                                         tmp_path):
    held, reached = threading.Event(), threading.Event()

    def held_script(request: dict) -> str:
        if request.get("tools"):  # the agent's first model call on service A waits here
            reached.set()
            held.wait(120)
        return SCRIPT(request)

    with ScriptedEngine(tiny_model_path, held_script) as engine_a, \
            ScriptedEngine(tiny_model_path, SCRIPT) as engine_b:
        a = start_service(engine_a.url, tmp_path / "a", tasks=HELLO, key=KEY, max_sessions=1)
        b = start_service(engine_b.url, tmp_path / "b", tasks=HELLO, key=KEY, max_sessions=2)
        client = make_client([a.url, b.url], max_concurrent_rollouts=2)
        try:
            async def run() -> tuple:
                first = [asyncio.create_task(client.rollout(seed=0)) for _ in range(2)]
                assert await asyncio.to_thread(reached.wait, 120), \
                    "no rollout reached service A's engine within 120 s"
                # A is full (max_sessions=1): it says so instead of queueing.
                busy = httpx.post(f"{a.url}/v1/rollouts", json={"seed": 0},
                                  headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
                assert busy.status_code == 429 and int(busy.headers["retry-after"]) >= 1
                a.kill()  # mid-rollout: its agent is waiting on a model call
                held.set()
                done = await asyncio.wait_for(asyncio.gather(*first), timeout=240)
                after = await asyncio.wait_for(client.rollout(seed=0), timeout=240)
                return done, after

            (r1, r2), r3 = asyncio.run(run())
        finally:
            held.set()
            a.kill()
            b.stop()
            client.close()

    lost = [r for r in (r1, r2) if r.service == a.url]
    kept = [r for r in (r1, r2) if r.service == b.url]
    assert len(lost) == len(kept) == 1, "the two rollouts were not spread over the two services"
    assert lost[0].cause == "infra_failure" and "died mid-rollout" in lost[0].error, lost[0]
    assert lost[0].trace is None
    for r in (kept[0], r3):  # the other service's rollouts are whole: trace, reward, outcome
        assert (r.cause, r.env_reward) == ("ok", 1.0), (r.cause, r.error)
        assert r.trace is not None and r.trace.schema_version == 1 and len(r.trace.turns) == 2
        assert r.outcome is not None and r.outcome.tool_call_count == 2
        assert r.timings["total"] > 0 and r.timings["client_total"] >= r.timings["total"]
    assert r3.service == b.url  # the dead service is avoided
    assert client.counts["infra_failure"] == 1 and client.counts["ok"] == 2
    assert client.lost == 1 and sum(client.counts.values()) == 3
    # What service A had captured before it died is on its disk (the proxy's per-call log).
    assert any(p.is_file() and p.stat().st_size for p in (tmp_path / "a" / "data").rglob("*"))


def test_the_session_protocol_auth_and_metrics_over_http(tiny_model_path, tmp_path):
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY)
        client = make_client([service.url])
        try:
            assert httpx.get(f"{service.url}/health").json()["ok"] is True
            assert httpx.get(f"{service.url}/metrics").status_code == 401
            wrong = httpx.post(f"{service.url}/v1/rollouts", json={},
                               headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401
            with pytest.raises(ValueError, match="key is missing"):
                RemoteSessionFactory([service.url], None)

            # The trainer pushed version 7 while this service was away: the next session brings
            # it, and the service's proxy stamps the agent's calls with it.
            client.pool.weight_version = 7
            session = client.create(seed=0)
            assert session.wait_for_completion() == 0
            trace = session.fetch_training_trace()
            assert len(trace.turns) == 2 and len(trace.to_trace_entries()) == 2
            assert {t.metadata["weight_version_start"] for t in trace.turns} == {7}
            verdict = session.verify()
            assert verdict.env_reward == 1.0 and verdict.metrics["tampered"] == []
            session.close()
            session.close()  # idempotent

            bad = httpx.post(f"{service.url}/v1/rollouts", json={"factory": {"harnes": "x"}},
                             headers={"Authorization": f"Bearer {KEY}"})
            assert bad.status_code == 400 and "harnes" in bad.json()["error"]["message"]
            # A task name the split lacks is refused, never run as the seed's task instead.
            stranger = httpx.post(f"{service.url}/v1/rollouts",
                                  json={"task": "no-such-task", "seed": 0},
                                  headers={"Authorization": f"Bearer {KEY}"})
            assert stranger.status_code == 400
            assert "'no-such-task' is not in this factory's split" in \
                stranger.json()["error"]["message"]
            metrics = httpx.get(f"{service.url}/metrics",
                                headers={"Authorization": f"Bearer {KEY}"}).json()
            assert metrics["in_flight"] == 0 and metrics["open_sessions"] == 0
            assert metrics["weight_version"] == 7
        finally:
            service.stop()
            client.close()


def test_a_full_service_answers_429_and_the_client_waits_its_retry_after(tiny_model_path,
                                                                        tmp_path):
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY, max_sessions=1)
        client = make_client([service.url], max_concurrent_rollouts=2)
        try:
            async def two() -> list:
                return await asyncio.wait_for(
                    asyncio.gather(client.rollout(seed=0), client.rollout(seed=0)), 300)

            results = asyncio.run(two())
            metrics = httpx.get(f"{service.url}/metrics",
                                headers={"Authorization": f"Bearer {KEY}"}).json()
        finally:
            service.stop()
            client.close()
    assert [r.cause for r in results] == ["ok", "ok"], [r.error for r in results]
    # One ran while the other was refused (never queued on the service), then admitted.
    assert metrics["rejected"] >= 1 and metrics["admitted"] == 2
    assert metrics["rollouts_by_cause"]["ok"] == 2 and metrics["in_flight"] == 0

TRAINER_SIDE = """
import asyncio, json, sys
from harness.client.remote import RemoteSessionFactory
import trainer.grpo, trainer.rollouts
from trainer.rollouts import as_rollout_source
from trainer.rows import trace_to_rows

url, key = sys.argv[1], sys.argv[2]
opts = json.loads(sys.argv[3])
source = as_rollout_source(lambda sampling: RemoteSessionFactory([url], key, **{**opts,
                           "sampling": sampling}), {"temperature": 1.0}, max_concurrent=1)
result = asyncio.run(source.rollout(seed=0))
rows, report = trace_to_rows(result.trace, rollout_id="r0")
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("openenv", "harbor"))
print(json.dumps({"cause": result.cause, "rows": len(rows), "turns": report.turns,
                  "imported": heavy}))
"""


def test_the_trainer_process_never_imports_openenv_or_harbor(tiny_model_path, tmp_path):
    """A trainer-side process (trainer.grpo + the client) runs a rollout and builds its rows."""
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY)
        try:
            opts = {k: v for k, v in OPTIONS.items() if k != "sampling"}
            run = subprocess.run([sys.executable, "-c", TRAINER_SIDE, service.url, KEY,
                                  json.dumps(opts)], cwd=REPO_ROOT, capture_output=True,
                                 text=True, timeout=300)
        finally:
            service.stop()
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["cause"] == "ok" and report["rows"] >= 1 and report["turns"] == 2, report
    assert report["imported"] == [], f"the trainer process imported {report['imported']}"


def test_trl_harness_rollout_loop_drives_the_remote_factory(tiny_model_path, tmp_path):
    """TRL 1.16's HarnessRolloutWorker runs `_loop_cls` in its child; vLLM (which the worker's
    parent checks for) is not in this venv, so the loop is built here as the child builds it."""
    import multiprocessing as mp
    from functools import partial

    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template
    from trl.experimental.async_grpo.openenv_harness import HarnessRolloutWorker

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    # The tiny model's template is our own (hermes tool calls, as Qwen's): TRL wants a response
    # template it knows. It only parses replies when it samples turns itself (not here).
    tokenizer.response_template = qwen3_template
    ctx = mp.get_context("spawn")
    with ScriptedEngine(tiny_model_path, SCRIPT) as engine:
        service = start_service(engine.url, tmp_path / "s", tasks=HELLO, key=KEY)
        factory = partial(RemoteSessionFactory, [service.url], KEY,
                          **{k: v for k, v in OPTIONS.items() if k != "sampling"})
        try:
            loop = HarnessRolloutWorker._loop_cls(
                harness_session_factory=factory, model_name="tiny",
                dataset=Dataset.from_list([{"prompt": [{"role": "user", "content": "hello"}]}]),
                reward_funcs=[], processing_class=tokenizer,
                eos_token_ids=[tokenizer.eos_token_id], rollout_buffer=ctx.Queue(),
                model_version_value=ctx.Value("i", 0), heartbeat_value=ctx.Value("d", 0.0),
                failed_event=ctx.Event(), exception_info_queue=ctx.Queue(),
                metrics_queue=ctx.Queue(), max_inflight_tasks=1, num_generations=1)
            completion, completion_ids, sequences, calls, failures, reward = asyncio.run(
                loop._generate_one({"task": "hello-file"}, None, None, group_id=0))
        finally:
            service.stop()
    assert reward == 1.0, "TRL's loop scored the rollout unscorable (see its warnings)"
    assert sequences and completion_ids and calls == 2 and failures == 0
    assert completion[-1]["role"] == "assistant"
