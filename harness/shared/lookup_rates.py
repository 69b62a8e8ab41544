"""Per-step rates of lookup-family rollouts: what an agent did right, step by step.

Why (issue 32): a pass rate alone cannot tell an agent that learned to read the file from one
that learned to guess a frequent word. From a rollout's recorded calls this counts, over the
scored rollouts of lookup tasks:

- `looked`: the first call's command names the source file (`cat key.txt`);
- `used_observation`: a later call's command holds the word the source file showed (the agent
  wrote what it saw; a guess hits it 1 time in 8). None on the "blind" variant, whose file
  holds no word;
- `passed`: the verifier's grade.

It reads what the engine returned (each turn's recorded response, the agent's own dialect: chat
tool calls, Responses items or Anthropic tool_use blocks all carry the command as text), never the
agent's logs, and it parses the task from its name, so the trainer's process needs no harbor.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from harness.shared.lookup_names import instance_of

__all__ = ["by_instruction", "step_rates", "step_rates_of_folder"]

_IDS = re.compile(r'"id": "[^"]*"')


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(word)}(?![A-Za-z0-9_])", text) is not None


def _agent_turns(record: dict) -> list[str]:
    """The engine's responses to the agent's own calls (aux calls left out), as text without
    the engine's random ids."""
    turns = (record.get("trace") or {}).get("turns") or []
    return [_IDS.sub("", json.dumps(t.get("response") or {}))
            for t in turns if not (t.get("metadata") or {}).get("aux")]


def step_rates(records: Iterable[dict], *, pass_threshold: float = 1.0) -> dict | None:
    """{"looked", "used_observation", "passed", "n"} over the scored lookup rollouts among
    `records` (full rollout records, trace included); None when there are none."""
    counts = {"looked": 0, "used_observation": 0, "passed": 0}
    n = blind = 0
    for record in records:
        inst = instance_of(record.get("task_id", ""))
        if inst is None or record.get("env_reward") is None:
            continue
        n += 1
        turns = _agent_turns(record)
        counts["looked"] += bool(turns) and _mentions(turns[0], inst.source)
        if inst.observed:
            counts["used_observation"] += any(_mentions(t, inst.observed) for t in turns[1:])
        else:
            blind += 1
        counts["passed"] += record["env_reward"] >= pass_threshold
    if not n:
        return None
    rates: dict = {k: round(v / n, 4) for k, v in counts.items()}
    if blind == n:
        rates["used_observation"] = None
    return {**rates, "n": n}


def step_rates_of_folder(folder: Path, *, pass_threshold: float = 1.0) -> dict | None:
    """`step_rates` of the full records a RecordingFactory wrote under `folder`/rollouts."""
    return step_rates((json.loads(p.read_text()) for p in sorted((folder / "rollouts")
                                                                 .glob("*.json"))),
                      pass_threshold=pass_threshold)


def by_instruction(summary: dict) -> dict:
    """A pass-rate summary (harness.eval.pass_rate_table's) with its lookup tasks' rows summed
    per instruction text (`key-answer-t0`: its 8 words), so a table of the 96 test tasks reads
    as 12 rows; rows of other tasks stay as they are."""
    per: dict[str, dict] = {}
    for task, row in summary.get("per_task", {}).items():
        inst = instance_of(task)
        key = inst.instruction_id if inst else task
        into = per.setdefault(key, {k: 0 for k in row if isinstance(row[k], int)})
        for k, v in row.items():
            if isinstance(v, int) and not isinstance(v, bool):
                into[k] = into.get(k, 0) + v
    return {**summary, "per_task": per}
