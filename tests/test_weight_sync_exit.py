# .venv/bin/python -m pytest tests/test_weight_sync_exit.py -x -q
"""A process that exits while a weight-sync thread still waits on a peer exits with its own code.

The CI run of 2026-12-04 passed all 1,457 tests and then died with SIGABRT (exit 134, "terminate
called without an active exception"): a test had left the trainer's gloo opener waiting for an
engine that never joined, and its 30 s timeout fired while the interpreter was shutting down
(trainer.weight_sync.exit_guard says why that aborts). Each case here leaves one such waiter
behind in a real process against the fake engine (real gloo), then holds the shutdown open past
the group's timeout with an object whose finalizer sleeps, as pytest's own long shutdown did.
Before the guard, 11 of 12 such runs aborted.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent(
    """
    import builtins, sys, time
    import torch
    from trainer.weight_sync import VLLMWeightSync, WeightSyncPushError, WeightSyncSetupError
    from trainer.weight_sync.fake_engine import FakeWeightTransferEngine

    case = sys.argv[1]
    model = torch.nn.Linear(4, 3)
    # Never stopped: the engine stays up, so nothing but the group's timeout ends the waiter.
    fake = FakeWeightTransferEngine(not_configured=(case == "open")).start()
    sync = VLLMWeightSync(fake.url, "harness_gloo", group_timeout_s=2, http_timeout_s=30)
    if case == "push":
        sync.push(model, 1)
        # the engine rejects the metadata and never joins the broadcast: the sender waits
        fake.fail["/update_weights"] = (500, '{"error": {"message": "bad update_info"}}')
    try:
        sync.push(model, 2)
    except (WeightSyncPushError, WeightSyncSetupError) as exc:
        print("push failed as the case wants:", type(exc).__name__, flush=True)


    class SlowShutdown:
        def __del__(self):
            time.sleep(3)  # past the 2 s group timeout, after daemon threads are frozen


    builtins.slow_shutdown = SlowShutdown()  # torn down late in the interpreter's shutdown
    sys.exit(7)
    """
)


@pytest.mark.parametrize("case", ["open", "push"])
def test_exit_with_a_waiter_still_blocked_on_a_peer_keeps_the_exit_code(case: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, case],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "push failed as the case wants" in result.stdout, result.stderr[-3000:]
    assert "terminate called" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 7, (result.returncode, result.stderr[-3000:])
