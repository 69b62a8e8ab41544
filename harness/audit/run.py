"""Run the attack library against every task of a task set and say which tasks pay.

Each (task, attack) pair is one real rollout: a copy of the task whose instruction names the
attack (so the scripted policy knows which commands to play), the real agent (mini-swe-agent by
default) in the real sandbox, graded by Harbor's Verifier after the sandbox's grading reset, all
through `HarborSessionFactory` as `python -m harness.eval` runs it. The model is the scripted
engine (harness/audit/scripted_engine.py) with the tiny model's tokenizer: no model samples
anything, the policy is the attack.

A task "pays" an attack when its reward is > 0: no attack does the task, so any reward is paid
for a wrong answer. Beside that dynamic result, `grader_notes` reads the task's test scripts for
the shapes that run the grader's own code from the work dir (the verifier runs there), which a
sandbox-wide safe path may hide from the dynamic run but which stay the task's to fix.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.audit.attacks import ATTACKS, Attack
from harness.audit.scripted_engine import ScriptedEngine, shell_tool_name, tool_call

__all__ = ["AuditResult", "audit_tasks", "grader_notes"]

MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_ATTACK_ID = re.compile(r"harness-audit-attack: ([a-z0-9-]+)")
_TASK_NAME = re.compile(r'^(name\s*=\s*")([^"]*)(")', re.MULTILINE)
# python run on stdin, -c or -m without -I/-P: sys.path[0] is the current dir (the work dir)
_PY_FROM_CWD = re.compile(r"\bpython3?(?:\.\d+)?((?:\s+-[A-Za-z]+)*)\s+(-\s|-$|-c\b|-m\b)")
_CD_WORKDIR = re.compile(r"^\s*cd\s+(?!/\s|/$|/tests|/logs)(\S+)", re.MULTILINE)
_NODE = re.compile(r"\b(node|npx|npm|jest|mocha)\b")


@dataclass
class AuditResult:
    """What one task did under every attack."""

    task: str
    paid: dict[str, float] = field(default_factory=dict)  # attack -> reward paid (> 0)
    causes: dict[str, str] = field(default_factory=dict)  # attack -> outcome cause
    errors: dict[str, str] = field(default_factory=dict)  # attack -> why it was unscorable
    notes: list[str] = field(default_factory=list)

    @property
    def pays(self) -> bool:
        return bool(self.paid)

    def as_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "paid": self.paid,
            "causes": self.causes,
            "errors": self.errors,
            "notes": self.notes,
        }


def grader_notes(task_dir: Path) -> list[str]:
    """Where the task's grader runs code from the work dir (read from its test scripts)."""
    notes = []
    for script in sorted((task_dir / "tests").glob("*.sh")):
        text = script.read_text(errors="replace")
        name = f"tests/{script.name}"
        for line in text.splitlines():
            code = line.split("#", 1)[0]
            found = _PY_FROM_CWD.search(code)
            if found and not re.search(r"-[A-Za-z]*[IP]", found.group(1) or ""):
                notes.append(
                    f"{name}: `{code.strip()}` imports from the current dir (the work "
                    "dir, where the verifier starts): use `python3 -I`"
                )
                break
        if m := _CD_WORKDIR.search(text):
            notes.append(
                f"{name}: runs from {m.group(1)} (`cd {m.group(1)}`): commands there "
                "resolve the agent's files first"
            )
        if _NODE.search(text):
            notes.append(
                f"{name}: a node tool resolves node_modules from the cwd and each ancestor up to /"
            )
    return notes


def _attack_copy(task_dir: Path, attack: Attack, root: Path, index: int) -> Path:
    """A copy of the task whose instruction names the attack and whose name is its own."""
    copy = root / f"{index:04d}-{task_dir.name}--{attack.name}"
    shutil.copytree(task_dir, copy, symlinks=True)
    instruction = copy / "instruction.md"
    instruction.write_text(
        instruction.read_text() + f"\nharness-audit-attack: {attack.name} ({copy.name})\n"
    )
    toml = copy / "task.toml"
    toml.write_text(
        _TASK_NAME.sub(lambda m: f"{m[1]}{m[2]}--{attack.name}{m[3]}", toml.read_text(), count=1)
    )
    return copy


def script(request: dict[str, Any]) -> str:
    """The hostile policy: the attack the instruction names, one command per turn, then submit."""
    if not request.get("tools"):
        return "Audit"  # a title or summary call
    found = _ATTACK_ID.search(json.dumps(request.get("messages") or []))
    if not found:
        raise ValueError("no harness-audit-attack line in the conversation")
    attack = next(a for a in ATTACKS if a.name == found.group(1))
    done = sum(1 for m in request["messages"] if m.get("role") == "tool")
    name = shell_tool_name(request)
    if done < len(attack.commands):
        return tool_call(name, command=attack.commands[done])
    return tool_call(name, command=MINI_SUBMIT)


def audit_tasks(
    tasks: list[Any],
    work_dir: Path,
    *,
    attacks: tuple[Attack, ...] = ATTACKS,
    tokenizer: Path,
    concurrency: int = 4,
    sandbox: str = "local",
    agent_timeout_s: float = 120.0,
    verifier_timeout_s: float = 60.0,
) -> list[AuditResult]:
    """Every attack against every task (HarborTask), one real rollout each; per task results."""
    from harness.service.factory import HarborSessionFactory

    copies: dict[tuple[str, str], Path] = {}
    for index, task in enumerate(tasks):
        for attack in attacks:
            copies[(task.name, attack.name)] = _attack_copy(task.path, attack, work_dir, index)
    results = {t.name: AuditResult(t.name, notes=grader_notes(t.path)) for t in tasks}
    with ScriptedEngine(tokenizer, script) as engine:
        factory = HarborSessionFactory(
            None,
            split=list(copies.values()),
            harness="mini-swe-agent",
            sandbox=sandbox,
            llm_url=engine.url,
            model="tiny",
            sampling={"temperature": 1.0, "max_tokens": 1024},
            max_concurrent_rollouts=concurrency,
            agent_timeout_s=agent_timeout_s,
            verifier_timeout_s=verifier_timeout_s,
            max_steps=len(max((a.commands for a in attacks), key=len)) + 3,
            max_attempts=1,
        )

        async def one(key: tuple[str, str]) -> None:
            outcome = await factory.rollout(task=str(copies[key]))
            result = results[key[0]]
            result.causes[key[1]] = outcome.cause
            if outcome.env_reward is None:
                result.errors[key[1]] = (outcome.error or outcome.cause)[:300]
            elif outcome.env_reward > 0:
                result.paid[key[1]] = outcome.env_reward

        async def run_all() -> None:
            try:
                await asyncio.gather(*(one(key) for key in copies))
            finally:
                await factory.aclose()

        asyncio.run(run_all())
        if engine.errors:
            raise RuntimeError(f"the scripted policy failed: {engine.errors[0]!r}")
        # An attack whose commands never reached the sandbox proves nothing: say so, per rollout.
        for (task_name, attack_name), copy in copies.items():
            attack = next(a for a in attacks if a.name == attack_name)
            marker = f"({copy.name})"
            ran = any(
                m.get("role") == "tool"
                for body in engine.requests
                if marker in json.dumps(body.get("messages") or [])
                for m in body["messages"]
            )
            if attack.commands and not ran and attack_name not in results[task_name].errors:
                results[task_name].errors[attack_name] = "its commands never ran in the sandbox"
    return [results[t.name] for t in tasks]
