"""A learnable task family: "create NAME containing WORD", generated as Harbor task directories.

Why it exists: the hand-written bundled tasks are far beyond the tiny default model, so their
verifier reward is almost always 0 and a training run cannot show learning (issue 18). This
family is sized to what a 2-layer, 64-wide model can learn from the instruction (measured in
plain torch, /work/shared/LEARNING.md): one file name and one word per instance, both drawn
from the vocabulary the tiny model was warmed up on (launchers/tiny_model_warmup.py FILES and
WORDS), because the model chooses among words it has seen and does not copy unseen ones.

The split is by combination, as in LEARNING.md: every name and every word occurs in train, and
the held-out instances are (name, word) pairs that no train instance uses, so a held-out pass
means the model read the instruction, not that it memorised an answer. The held-out pairs form
a permutation (each name and each word exactly once), chosen by the seed; every instruction
template is used on both sides.

Distractors: mini-swe-agent's own prompt contains `hello = "world"` in an example, and
LEARNING.md found names that occur in the system prompt to be the hardest held-out cases. The
warm-up vocabulary has only four words, so `hello` and `world` stay (dropping them halves the
family); per-word pass rates in an evaluation show whether they lag.

    python -m harness.tasks.family --out DIR [--seed 0]     # DIR/train/..., DIR/heldout/...

The committed set under harness/tasks/families/create-file is this generator's output for the
defaults (tests/test_task_family.py regenerates it and compares byte for byte). Load a split
with `family_tasks("train")` / `family_tasks("heldout")` or `--tasks <that folder>`.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.tasks.errors import TaskSourceError
from harness.tasks.loader import HarborTask, load_folder
from harness.tasks.task_folder import (
    TASK_SETTINGS,
    clear_output,
    exact_file_verifier,
    write_manifest,
    write_task_dir,
)

__all__ = ["FAMILY_DIR", "SPLITS", "FamilyInstance", "family_tasks", "generate", "instances",
           "write_family"]

FAMILY_DIR = Path(__file__).resolve().parent / "families" / "create-file"
SPLITS = ("train", "heldout")
# The tiny model's warm-up vocabulary (launchers/tiny_model_warmup.py): it has sampled these.
NAMES = ("hello.txt", "answer.txt", "notes.txt", "out.txt")
WORDS = ("hello", "world", "done", "42")
# The first is the warm-up's own phrasing; the others make the model find NAME and WORD in text
# it was not drilled on.
TEMPLATES = (
    "Create {name} containing {word}.",
    "Write the word {word} into the file {name}.",
    "Make a file named {name} in /app whose only content is {word}.",
)

_TASK_TOML = """\
schema_version = "1.4"

[task]
name = "harness-family/{task_name}"
description = "Create {name} containing {word} (generated: harness.tasks.family)."
keywords = ["files", "shell", "family"]

[metadata]
family = "create-file"
split = "{split}"
file = "{name}"
word = "{word}"
template = {template}

""" + TASK_SETTINGS

_SOLVE_SH = """\
#!/bin/bash
echo {word} > /app/{name}
"""

_DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\n"


@dataclass(frozen=True)
class FamilyInstance:
    """One generated task: its (name, word) pair, its template and its split."""

    name: str
    word: str
    template: int
    split: str

    @property
    def task_name(self) -> str:
        return f"create-{Path(self.name).stem}-{self.word}-t{self.template}"

    @property
    def instruction(self) -> str:
        return TEMPLATES[self.template].format(name=self.name, word=self.word)


def _check_vocabulary(names: Sequence[str], words: Sequence[str]) -> None:
    problems = []
    if len(set(names)) != len(names) or len(set(words)) != len(words):
        problems.append("names and words must not repeat")
    if len(names) != len(words) or len(names) < 2:
        problems.append(f"need as many names as words, at least 2 (got {len(names)} names, "
                        f"{len(words)} words): the held-out pairs are a permutation of them")
    safe = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
    bad = [s for s in (*names, *words) if not s or not set(s) <= safe or s.startswith((".", "-"))]
    if bad:
        problems.append(f"{bad}: names and words may hold only letters, digits, '.', '_' and "
                        "'-' and must not start with '.' or '-' (they go into shell scripts)")
    if problems:
        raise TaskSourceError("task family vocabulary: " + "; ".join(problems))


def instances(*, names: Sequence[str] = NAMES, words: Sequence[str] = WORDS,
              templates: int = len(TEMPLATES), seed: int = 0) -> list[FamilyInstance]:
    """Every instance of the family, train and held-out, in a deterministic order.

    Held-out pairs: name i with word perm[i] for a seeded random permutation, so each name and
    each word is held out once and still occurs in train with every other partner.
    """
    _check_vocabulary(names, words)
    if not 1 <= templates <= len(TEMPLATES):
        raise TaskSourceError(f"templates={templates}: use 1..{len(TEMPLATES)}")
    perm = list(range(len(words)))
    random.Random(seed).shuffle(perm)
    heldout = {(names[i], words[perm[i]]) for i in range(len(names))}
    out = []
    for name in names:
        for word in words:
            split = "heldout" if (name, word) in heldout else "train"
            out.extend(FamilyInstance(name, word, t, split) for t in range(templates))
    return out


def _write_instance(inst: FamilyInstance, task_dir: Path) -> None:
    write_task_dir(
        task_dir, instruction=inst.instruction,
        task_toml=_TASK_TOML.format(task_name=inst.task_name, name=inst.name, word=inst.word,
                                    split=inst.split, template=inst.template),
        dockerfile=_DOCKERFILE,
        test_sh=exact_file_verifier("harness.tasks.family", inst.name, inst.word),
        solve_sh=_SOLVE_SH.format(name=inst.name, word=inst.word))


def write_family(out: str | Path, family: Sequence[FamilyInstance], *, seed: int = 0,
                 overwrite: bool = False) -> dict:
    """Write `family` as OUT/train/<task>/ and OUT/heldout/<task>/ plus OUT/manifest.json."""
    root = Path(out)
    clear_output(root, overwrite=overwrite)
    for inst in family:
        _write_instance(inst, root / inst.split / inst.task_name)
    manifest = {
        "family": "create-file",
        "generator": "python -m harness.tasks.family",
        "seed": seed,
        "templates": list(TEMPLATES[: 1 + max(i.template for i in family)]),
        "splits": {s: sorted(i.task_name for i in family if i.split == s) for s in SPLITS},
        "heldout_pairs": sorted({f"{i.name}:{i.word}" for i in family if i.split == "heldout"}),
    }
    return write_manifest(root, manifest)


def generate(out: str | Path, *, seed: int = 0, overwrite: bool = False) -> dict:
    """The default family (warm-up vocabulary, every template) written under `out`."""
    return write_family(out, instances(seed=seed), seed=seed, overwrite=overwrite)


def family_tasks(split: str, root: str | Path = FAMILY_DIR) -> list[HarborTask]:
    """The loaded tasks of one split ("train" or "heldout") of a generated family folder."""
    if split not in SPLITS:
        raise TaskSourceError(f"split {split!r}: use one of {', '.join(SPLITS)}")
    return load_folder(Path(root) / split, source=f"family:{split}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tasks.family",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write train/ and heldout/ into")
    parser.add_argument("--seed", type=int, default=0, help="picks the held-out pairs")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a folder this generator wrote before")
    args = parser.parse_args(argv)
    try:
        manifest = generate(args.out, seed=args.seed, overwrite=args.overwrite)
    except TaskSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = {s: len(v) for s, v in manifest["splits"].items()}
    print(f"wrote {counts['train']} train and {counts['heldout']} held-out tasks to {args.out} "
          f"(held-out pairs: {', '.join(manifest['heldout_pairs'])})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
