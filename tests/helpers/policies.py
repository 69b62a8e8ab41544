"""A scripted model policy for the bundled hello-file task, shared by the viewer's browser test
(tests/test_view_browser.py) and the real runs behind its screenshots (bench/view/real_run.py).

Played by harness.audit.scripted_engine.ScriptedEngine: in training one rollout of each pair
solves the task and the other only talks, so every group has an advantage to show; in eval all
solve. It answers mini-swe-agent's and opencode's requests alike (a title call, a retry after a
reply without a tool call, mini-swe-agent's submit command).
"""

from __future__ import annotations

import json
import threading
from typing import Any

from harness.audit.scripted_engine import tool_call
from harness.tasks import BUNDLED_DIR

__all__ = ["DONE", "SOLVE", "SUBMIT", "TALK", "TASK_DIR", "GreetingPolicy"]

TASK_DIR = BUNDLED_DIR / "hello-file"
SOLVE = "printf 'Hello, Harness!\\n' > greeting.txt && echo wrote-greeting"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
TALK = "I would describe the greeting file instead of writing it."
DONE = "Done: greeting.txt holds the greeting."


class GreetingPolicy:
    """Each rollout's first call (system + task only) decides its line: even ones solve, odd
    ones only talk (when `talkers`), so a group of two has one of each. mini-swe-agent answers a
    reply without a tool call by resending system + task + a "No tool calls found" message (the
    reply itself dropped: a rewritten history), so a request with more than the first two
    messages and no assistant message is a talker's retry."""

    def __init__(self, talkers: bool):
        self.talkers = talkers
        self.first_calls = 0
        self._lock = threading.Lock()

    def __call__(self, request: dict[str, Any]) -> str:
        if not request.get("tools"):  # an aux call (a title): not a rollout's first call
            return "Greeting file"
        messages = request.get("messages") or []
        if not any(m.get("role") == "assistant" for m in messages):
            if len(messages) > 2:
                return TALK
            with self._lock:
                k, self.first_calls = self.first_calls, self.first_calls + 1
            return TALK if self.talkers and k % 2 else tool_call("bash", command=SOLVE)
        if not any(m.get("role") == "tool" for m in messages):
            return tool_call("bash", command=SOLVE)
        if "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in json.dumps(messages[:2]):
            return tool_call("bash", command=SUBMIT)  # mini-swe-agent stops on its submit command
        return DONE
