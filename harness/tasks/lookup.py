"""A multi-step task family: read a word from a file in the sandbox, then write it elsewhere.

Why it exists (issue 32): the create-file family is solved by one command copied from the
instruction, so a run on it never shows an agent acting on what it observed, and exercises no
multi-turn row. Here the instruction names a source file and a target file but not the word:
the agent must look (`cat key.txt`, which prints `word: table`), see the word in the tool
output, and write it (`echo table > answer.txt`). Two agent steps, the second depending on the first's observation.

Contrastive by construction: every instruction text has one instance per word in `VALUES` (8),
identical but for the word in the source file, so a policy that ignores the observation scores
at most 1/8 on any instruction. (A one-command `cp key.txt answer.txt` also passes: it reads the
sandbox too, as does the reference `awk '{print $2}' key.txt > answer.txt`. The per-step rates of harness.shared.lookup_rates tell the two apart.)

Three splits by (source, target) pair, every template and every word on each side:
- **test**: 4 pairs, a permutation (each source and each target once); read only by the main
  command's before/after table and the bench, never used to choose anything;
- **dev**: 4 other pairs, another permutation; what warm starts and settings are tuned on;
- **train**: the other 8 pairs.
So a test pass means the model read a (source, target) combination it never trained on. Names
and words come from the tiny model's tokenizer as single pieces (`table` and ` table` are one
token each), so copying the word from the tool output to the command is one token's copy.

Diagnostics (`variant=`): "swap" writes each instance with the word rotated to the next value in
`VALUES` (the answer must follow the file, not the instance seen in training); "blind" leaves
the word out of the source file (`word:`; a policy that uses the observation falls to chance, 1/8).

    python -m harness.tasks.lookup --out DIR [--variant swap|blind]   # DIR/{train,dev,test}/...

The committed set under harness/tasks/families/lookup is this generator's output for the
defaults (tests/test_task_lookup.py regenerates it and compares byte for byte). Load a split with
`lookup_tasks("test")` or `--tasks lookup:test`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.shared.lookup_names import (
    SOURCES,
    SPLITS,
    TARGETS,
    TEMPLATES,
    VALUES,
    VARIANTS,
    LookupInstance,
)
from harness.tasks.errors import TaskSourceError
from harness.tasks.loader import HarborTask, load_folder
from harness.tasks.task_folder import (
    TASK_SETTINGS,
    clear_output,
    exact_file_verifier,
    write_manifest,
    write_task_dir,
)

# The family's vocabulary (SOURCES, VALUES, LookupInstance, ...) is harness.shared.lookup_names:
# the trainer's process reads task names with it and imports nothing of this folder.
__all__ = ["LOOKUP_DIR", "generate", "instances", "lookup_tasks", "source_text", "write_lookup"]

LOOKUP_DIR = Path(__file__).resolve().parent / "families" / "lookup"
# Pair (SOURCES[i], TARGETS[(i + shift) % 4]): shift 0 is test, 1 is dev, 2 and 3 are train.
# Each split's pairs are a permutation, so every source and target occurs in every split.
_SPLIT_OF_SHIFT = {0: "test", 1: "dev", 2: "train", 3: "train"}

_TASK_TOML = """\
schema_version = "1.4"

[task]
name = "harness-lookup/{task_name}"
description = "Copy the word in {source} into {target} (generated: harness.tasks.lookup)."
keywords = ["files", "shell", "family", "multi-step"]

[metadata]
family = "lookup"
split = "{split}"
variant = "{variant}"
source = "{source}"
target = "{target}"
value = "{value}"
expected = "{expected}"
template = {template}
instruction_id = "{instruction_id}"

""" + TASK_SETTINGS

_SOLVE_SH = """\
#!/bin/bash
cd /app && awk '{{print $2}}' {source} > {target}
"""

_DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\nCOPY {source} /app/{source}\n"


def source_text(word: str) -> str:
    """What the source file holds: `word: table`. The space matters to a small model: the
    tool result then carries the word as the same token the command needs (` table`), so
    writing it is a copy of one token, where a bare `table` (after a quote in the agent's JSON
    tool result) is another token that a 2-layer model must learn to map word by word (the
    first warm start copied 0% that way). "blind" leaves the word out: `word:`."""
    return f"word: {word}\n" if word else "word:\n"


def instances(variant: str = "plain") -> list[LookupInstance]:
    """Every instance of the family, all splits, in a deterministic order."""
    if variant not in VARIANTS:
        raise TaskSourceError(f"variant {variant!r}: use one of {', '.join(VARIANTS)}")
    out = []
    for shift, split in _SPLIT_OF_SHIFT.items():
        for i, source in enumerate(SOURCES):
            target = TARGETS[(i + shift) % len(TARGETS)]
            out.extend(LookupInstance(source, target, value, template, split, variant)
                       for template in range(len(TEMPLATES)) for value in VALUES)
    return out


def _write_instance(inst: LookupInstance, task_dir: Path) -> None:
    write_task_dir(
        task_dir, instruction=inst.instruction,
        task_toml=_TASK_TOML.format(
            task_name=inst.task_name, source=inst.source, target=inst.target, value=inst.value,
            expected=inst.expected, split=inst.split, variant=inst.variant,
            template=inst.template, instruction_id=inst.instruction_id),
        dockerfile=_DOCKERFILE.format(source=inst.source),
        environment={inst.source: source_text(inst.observed)},
        test_sh=exact_file_verifier("harness.tasks.lookup", inst.target, inst.expected),
        solve_sh=_SOLVE_SH.format(source=inst.source, target=inst.target))


def write_lookup(out: str | Path, family: list[LookupInstance], *, overwrite: bool = False
                 ) -> dict:
    """Write `family` as OUT/<split>/<task>/ plus OUT/manifest.json."""
    root = Path(out)
    clear_output(root, overwrite=overwrite)
    for inst in family:
        _write_instance(inst, root / inst.split / inst.task_name)
    manifest = {
        "family": "lookup",
        "generator": "python -m harness.tasks.lookup",
        "variant": family[0].variant if family else "plain",
        "templates": list(TEMPLATES),
        "values": list(VALUES),
        "splits": {s: sorted(i.task_name for i in family if i.split == s) for s in SPLITS},
        "pairs": {s: sorted({f"{i.source}>{i.target}" for i in family if i.split == s})
                  for s in SPLITS},
    }
    return write_manifest(root, manifest)


def generate(out: str | Path, *, variant: str = "plain", overwrite: bool = False) -> dict:
    """The family (every split) written under `out`."""
    return write_lookup(out, instances(variant), overwrite=overwrite)


def lookup_tasks(split: str, root: str | Path = LOOKUP_DIR) -> list[HarborTask]:
    """The loaded tasks of one split ("train", "dev" or "test") of a generated family folder."""
    if split not in SPLITS:
        raise TaskSourceError(f"lookup split {split!r}: use one of {', '.join(SPLITS)} "
                              "(lookup:train, lookup:dev, lookup:test)")
    return load_folder(Path(root) / split, source=f"lookup:{split}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.tasks.lookup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write train/, dev/, test/ into")
    parser.add_argument("--variant", choices=VARIANTS, default="plain",
                        help="swap: the file holds the next word; blind: the file holds no word")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace a folder this generator wrote before")
    args = parser.parse_args(argv)
    try:
        manifest = generate(args.out, variant=args.variant, overwrite=args.overwrite)
    except TaskSourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = ", ".join(f"{len(v)} {s}" for s, v in manifest["splits"].items())
    print(f"wrote {counts} tasks ({args.variant}) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
