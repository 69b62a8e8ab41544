"""The lookup task family's names: its files, words and templates, one instance, a task's name.

Why it lives in harness/shared: the family is generated and loaded where rollouts run
(harness/tasks/lookup.py, with Harbor), but the trainer's process reads what its rollouts did from
their records, which name the task only (`harness-lookup/lookup-key-answer-t0-table`):
harness.shared.lookup_rates parses that name back into an instance here, with no harbor and no
task folder. One vocabulary for both, so the generator and the reader cannot drift apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SOURCES", "SPLITS", "TARGETS", "TEMPLATES", "VALUES", "VARIANTS", "LookupInstance",
           "instance_of", "instruction_of"]

SPLITS = ("train", "dev", "test")
VARIANTS = ("plain", "swap", "blind")
SOURCES = ("key.txt", "value.txt", "input.txt", "data.txt")
TARGETS = ("answer.txt", "out.txt", "notes.txt", "result.txt")
VALUES = ("table", "queue", "block", "frame", "stack", "pipe", "tree", "lock")
TEMPLATES = (
    "The file {source} holds a word. Create {target} containing that word.",
    "Read the word stored in {source} and write it into the file {target}.",
    "Make a file named {target} in /app whose only content is the word found in {source}.",
)

_NAME = re.compile(r"(?:.*/)?lookup-(?P<source>[a-z]+)-(?P<target>[a-z]+)-t(?P<template>\d+)-"
                   r"(?P<value>[a-z]+)(?:-(?P<variant>swap|blind))?$")


@dataclass(frozen=True)
class LookupInstance:
    """One generated task: where the word is, where it must go, which word, which template."""

    source: str
    target: str
    value: str
    template: int
    split: str
    variant: str = "plain"

    @property
    def observed(self) -> str:
        """What the source file holds: the value, the next value ("swap") or nothing ("blind")."""
        if self.variant == "swap":
            return VALUES[(VALUES.index(self.value) + 1) % len(VALUES)]
        return "" if self.variant == "blind" else self.value

    @property
    def expected(self) -> str:
        """What the verifier wants in the target: the word the file holds; "blind" keeps the
        instance's own word, which only a guess can give."""
        return self.value if self.variant == "blind" else self.observed

    @property
    def instruction_id(self) -> str:
        """The instruction text's id: instances that share it differ only in the word."""
        return f"{Path(self.source).stem}-{Path(self.target).stem}-t{self.template}"

    @property
    def task_name(self) -> str:
        suffix = "" if self.variant == "plain" else f"-{self.variant}"
        return f"lookup-{self.instruction_id}-{self.value}{suffix}"

    @property
    def instruction(self) -> str:
        return TEMPLATES[self.template].format(source=self.source, target=self.target)


def instance_of(task_id: str) -> LookupInstance | None:
    """The lookup instance a task id names (`harness-lookup/lookup-key-answer-t0-table`), or
    None for a task of any other family."""
    match = _NAME.match(task_id)
    if not match:
        return None
    source, target = match["source"] + ".txt", match["target"] + ".txt"
    variant = match["variant"] or "plain"
    if source not in SOURCES or target not in TARGETS or match["value"] not in VALUES \
            or variant not in VARIANTS:
        return None
    return LookupInstance(source, target, match["value"], int(match["template"]), "", variant)


def instruction_of(task_id: str) -> str:
    """A lookup task's instruction id (`key-answer-t0`), any other task's id as it is."""
    inst = instance_of(task_id)
    return inst.instruction_id if inst else task_id
