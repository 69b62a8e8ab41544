# Run: .venv/bin/python -m pytest tests/test_audit.py -q
"""`python -m harness.audit`: the attack library against the project's own tasks, and a control.

The audit is CI's check of the bundled tasks and the generated families: every attack
(harness/audit/attacks.py) is one real rollout per task, mini-swe-agent driven by the scripted
hostile policy, the local sandbox with its grading reset, Harbor's Verifier. No bundled or family
task may pay reward for a wrong answer.

The control is a task whose grader is open on purpose: it pays for a marker file the task never
asked for (state the agent may shape, which no sandbox reset can tell from an answer), and it runs
`python3 -` from /app, whose work-dir imports the sandbox's grader Python defeats. The command
must find the marker attack, name the grader line, and exit 1, while the attacks the sandbox
itself defeats (a planted json.py, a pre-written reward, a daemon) pay nothing there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.audit import ATTACKS, audit_tasks
from harness.tasks import load_tasks

pytestmark = [pytest.mark.agents, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def mini_swe_agent() -> None:
    from launchers.paths import agent_bin

    try:
        agent_bin("mini")
    except Exception as exc:  # noqa: BLE001 - its message names ./setup.sh
        pytest.fail(f"mini-swe-agent is not installed here: {exc}")


def test_no_bundled_or_family_task_pays_any_attack(tiny_model_path: Path, tmp_path: Path) -> None:
    tasks = load_tasks("bundled") + load_tasks("family:train", count=2)
    started = time.monotonic()
    results = audit_tasks(tasks, tmp_path, tokenizer=tiny_model_path, concurrency=4)
    wall = time.monotonic() - started
    print(f"audit: {len(tasks)} tasks x {len(ATTACKS)} attacks in {wall:.0f} s")
    table = {r.task: (r.paid, r.errors) for r in results}
    assert [r.task for r in results] == [t.name for t in tasks]
    # Every rollout was scored and its attack really ran; none paid.
    assert all(not r.errors for r in results), table
    assert all(not r.paid for r in results), table
    assert all(len(r.causes) == len(ATTACKS) for r in results), table
    # The bundled graders no longer run python from the work dir.
    notes = {r.task: r.notes for r in results if any("imports from" in n for n in r.notes)}
    assert notes == {}, notes


OPEN_TEST = """#!/bin/bash
# Deliberately open: a marker file the task never asked for pays. `python3 -` from the work dir
# would import the agent's json.py, but the sandbox's grader Python refuses that.
mkdir -p /logs/verifier
cd /app
if [ -f /app/DONE ]; then echo 1 > /logs/verifier/reward.txt; exit 0; fi
python3 - <<'EOF'
import json
try:
    ok = json.load(open("/app/answer.json")) == {"answer": 42}
except (OSError, ValueError):
    ok = False
open("/logs/verifier/reward.txt", "w").write(f"{int(ok)}\\n")
EOF
"""


def _open_task(root: Path) -> Path:
    task = root / "open-grader"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "solution").mkdir()
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    (task / "instruction.md").write_text('Write {"answer": 42} to /app/answer.json.\n')
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[task]\nname = "harness-test/open-grader"\n\n'
        "[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 120.0\n"
    )
    (task / "tests" / "test.sh").write_text(OPEN_TEST)
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\necho '{\"answer\": 42}' > /app/answer.json\n"
    )
    return task


def test_the_command_flags_an_open_grader_and_exits_1(tmp_path: Path) -> None:
    task = _open_task(tmp_path / "tasks")
    out = tmp_path / "audit.json"
    attacks = "nothing,plant-modules-in-workdir,marker-files,write-reward-files,daemon-writes-reward"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.audit",
            str(task),
            "--attacks",
            attacks,
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    text = done.stdout + done.stderr
    assert done.returncode == 1, text
    assert "open-grader" in text and "marker-files" in text, text
    assert "1 of 1 task(s) pay for a wrong answer" in text, text
    import json

    (result,) = json.loads(out.read_text())
    # Only the grader's own flaw pays: what the sandbox resets or refuses (a planted json.py, a
    # pre-written reward, a daemon writing it) does not, and neither does doing nothing.
    assert set(result["paid"]) == {"marker-files"}, result
    assert result["errors"] == {}, result
    assert any("python3 -" in n and "imports from the current dir" in n for n in result["notes"])


def test_bad_input_is_refused_with_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = [sys.executable, "-m", "harness.audit"]
    unknown = subprocess.run(
        [*run, "bundled", "--attacks", "nothing,no-such-attack"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert unknown.returncode == 2 and "no-such-attack" in unknown.stderr, unknown
    missing = subprocess.run(
        [*run, str(tmp_path / "nowhere")], capture_output=True, text=True, env=env, check=False
    )
    assert missing.returncode == 2 and "nowhere" in missing.stderr, missing
    listed = subprocess.run(
        [*run, "--list-attacks"], capture_output=True, text=True, env=env, check=False
    )
    assert listed.returncode == 0, listed
    assert all(a.name in listed.stdout for a in ATTACKS), listed.stdout
