"""The default model for the lookup family: the tiny model warm-started on its *train* pairs.

Why (issue 32): the main command's family is now multi-step (harness/tasks/lookup.py): look at
the source file, then write the word it holds into the target. The create-file warm start
(harness/warm/create_file.py) never saw a tool result, so it cannot act on one. This builds the
starting policy the same way, by supervised fine-tuning on traces captured through the capture
proxy, with both turns:

1. capture: a scripted policy plays one instance of every *train* instruction text through the
   real mini-swe-agent CLI, the capture proxy, bubblewrap and the real verifiers: `cat SOURCE`,
   then `echo WORD > TARGET` with WORD read from the tool result the agent sent back. Dev and
   test pairs are never captured or trained on.
2. SFT from the create-file warm start (models/tiny-qwen3-create-file: it already writes
   `echo WORD > NAME` and copies words from its prompt; from the bare tiny model 1,200 steps
   taught the format but copied the shown word 29% of the time on dev), plain torch, loss on
   completion tokens only, on rows made from those turns by swapping
   in words and file names from outside the family (`synthetic_vocabulary`): first turns (the
   instruction's source -> `cat SOURCE`) and second turns (the tool result's word and the
   instruction's target -> `echo WORD > TARGET`). Hundreds of words make copying the word out of
   the tool result the only fit; no row pairs two of the family's names (`_Turns.swaps`), so
   reading each name from the instruction is the only way to the right file.
   The curriculum of create_file.py: the instruction under a one-line system prompt, then the
   prompt cut after the instruction, then the whole prompt.

   The copy needs many whole-prompt steps before it forms, and where it forms depends on the
   build, not the step count alone (dev probe, 8 samples x 12 instructions, +-5 points; 300 bare
   and 100 short steps first; 2026-12-04): full steps 100: 3%, 125: 19%, 150: 17%, 200: 19%,
   250: 56%, 300: 80% (an earlier build's 100 steps: 94%; another's: 15%). A model caught in
   the middle of that change is a fragile starting point (the committed 97-step build of
   2026-12-03 copied 25% on dev and 10% on test, and RL moved it +1 to +10 points).
4. calibrate: so the build copies at full strength and then a noisy teacher sets how often it
   uses the copy. `calibrate_steps` more whole-prompt steps at a lower learning rate on rows
   where a `wrong_word` share of the taught second calls write another word than the one shown
   (and a `wrong_first` share of first calls read another file). It moves toward the
   teacher's own rate (the shown word among the eight in 1 - 0.7 + 0.7/8 ~ 39% of its
   family-word answers) instead of a step count's accident. Committed (40 steps at 5e-4 on both
   turns of every noisy swap, so half the rows are first turns, all right): dev 51%, train 63%
   (the main command's test figures: docs/learning.md).
   An exploratory build whose calibrating rows were mostly second turns (dev, 8 samples x 12):
   30 steps 29%, 40: 31%, 50: 30%, 60: 46%; from its 40-step model `--seed 0` went 50% -> 79%
   on test. The starting policy knows how to copy and mostly does not use it: RL has to learn to
   act on what the first step observed, and the swap test checks the trained policy's words
   follow the file.
   (A noisy teacher in the copy-forming stage itself kept the copy from forming: 0-17%.)
5. probe: T=1 samples on the *dev* prompts (a dev prompt is a captured train prompt with the
   instruction, source, target and word swapped; the ids round-trip through the tokenizer):
   first turn right (`cat SOURCE`), second turn right given a right first turn, its word and
   target counted apart.

The target is the band where GRPO has room to move (roughly 15-60% whole-episode passes, from
below ~10% it barely moves: ../shared/LEARNING.md), not the highest score. The result is
committed under models/tiny-qwen3-lookup/ with BUILD.json (launchers/warm_models.py:
LOOKUP_MODEL, `committed_lookup_model`):

    .venv/bin/python -m harness.warm.lookup --commit     # minutes on 2 cores
    .venv/bin/python -m harness.warm.lookup --out DIR    # build elsewhere, print the probe

Other agents (`--harness opencode` and `--harness claude-code`, committed under
models/tiny-qwen3-lookup-HARNESS/, that --harness's default on lookup:*; LOOKUP_AGENTS in
launchers/warm_models.py): the same stages on traces captured through that agent's real CLI,
from its create-file warm start (harness/warm/agents.py), the turns found by their commands
(opencode asks the model for a title first). Every row shares the agent's ~9.7k-token system
prompt and tools, so the stages after the bare one run on agents.py's shared-prefix cache
(PrefixSFT: the prefix computed once a step, the loss that of whole sequences), 0.5 s a step
here instead of several. opencode's build
(2026-12-06, 300 bare + 300 full + 80 calibrating steps, 8 samples per dev instruction): first
step `cat SOURCE` 0% -> 96%, the shown word written 0% -> 41% (40 calibrating steps: 78%).
Claude Code's (2026-12-06, the defaults: 300 bare + 100 short + 300 full + 40 calibrating steps,
42 min here: ~20k prompt tokens shared, ~1k after the instruction, ~6 s a whole-prompt step):
first step 0% -> 97%, the shown word 0% -> 83%, above the band; more calibrating steps would
lower it (80 did for opencode), not tried. Its probe reads the command out of the call's JSON
(`_shell_command`): Claude Code's `Bash` call carries a description after it.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.warm.agents import PrefixSFT, shared_prefix
from harness.warm.create_file import (
    _ASSIST,
    _BARE,
    completion_loss,
    finish_build,
    record_scripted_rollouts,
    round_trip_text,
    save_model,
    sft_steps,
)
from launchers.warm_models import AGENTS, LOOKUP_AGENTS, lookup_model_dir, lookup_rebuild_command

__all__ = ["build_lookup_model", "probe_models", "synthetic_vocabulary"]

BARE_STEPS, SHORT_STEPS, FULL_STEPS, LR, SEED, SYNTHETIC = 300, 100, 300, 2e-3, 0, 900
# The calibrating stage (step 4 of the docstring): the noisy teacher of _Turns.swaps.
CALIBRATE_STEPS, CALIBRATE_LR, WRONG_FIRST, WRONG_WORD = 40, 5e-4, 0.0, 0.7
# Another agent's defaults where they differ. opencode: its instruction ends the prompt, so the
# short cut is the whole prompt (no short stage); 40 calibrating steps left its copy at 78% on
# dev, 80 at 41% (and 40 at 1e-3: 62%), in the band mini-swe-agent's build is in.
AGENT_DEFAULTS: dict[str, dict[str, int]] = {"opencode": {"short_steps": 0,
                                                           "calibrate_steps": 80}}


def _shell_command(reply: str) -> str | None:
    """The command of a reply's first tool call as vLLM's hermes parser reads it, whatever else
    the call carries (Claude Code's `Bash` takes a description after the command; Codex's
    `exec_command` calls it `cmd`); None when the reply makes no shell call."""
    from harness.audit.vllm_chat import parse_hermes

    _, calls = parse_hermes(reply)
    arguments = json.loads(calls[0]["function"]["arguments"]) if calls else None
    if not isinstance(arguments, dict):
        return None
    command = arguments.get("command", arguments.get("cmd"))
    return command.strip() if isinstance(command, str) else None


def _last_tool_text(request: dict) -> str:
    tools = [m for m in request["messages"] if m.get("role") == "tool"]
    content = tools[-1].get("content") if tools else ""
    if isinstance(content, list):
        content = " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def capture_train_traces(out: Path, harness: str = "mini-swe-agent") -> list[dict]:
    """Scripted two-step solutions of one instance per train instruction text (step 1)."""
    from harness.audit.scripted_engine import shell_call
    from harness.shared.lookup_names import VALUES
    from harness.tasks.lookup import lookup_tasks

    by_instruction: dict[str, Any] = {}
    for task in lookup_tasks("train"):
        by_instruction.setdefault(task.instruction.strip(), task)
    tasks = sorted(by_instruction.values(), key=lambda t: t.name)
    # One instance per instruction, words spread over the eight.
    rng = random.Random(7)

    def policy(request: dict) -> str:
        if not request.get("tools"):
            return "A title"
        text = json.dumps(request["messages"])
        meta = next(t.metadata for i, t in by_instruction.items() if json.dumps(i)[1:-1] in text)
        steps = sum(1 for m in request["messages"] if m.get("role") == "tool")
        if steps == 0:
            return shell_call(request, f"cat {meta['source']}")
        seen = [w for w in VALUES if re.search(rf"\b{w}\b", _last_tool_text(request))]
        if len(seen) != 1:
            raise RuntimeError(f"the tool result does not show one family word: {seen}")
        return shell_call(request, f"echo {seen[0]} > {meta['target']}")

    chosen = []
    for task in tasks:
        siblings = [t for t in lookup_tasks("train") if t.instruction.strip()
                    == task.instruction.strip()]
        chosen.append(rng.choice(siblings))
    return record_scripted_rollouts(policy, chosen, out, harness=harness, max_steps=2,
                                    min_turns=2)


def synthetic_vocabulary(vocab: dict[str, int], seed: int) -> tuple[list[str], list[str]]:
    """(words, file names) from outside the family: tokenizer pieces that are one token with and
    without a leading space (as the family's words are), names `<piece>.txt`."""
    from harness.shared.lookup_names import SOURCES, TARGETS, VALUES

    family = set(VALUES) | {Path(n).stem for n in (*SOURCES, *TARGETS)}
    pool = sorted(p[1:] for p in vocab if p.startswith("Ġ") and p[1:].isalpha()
                  and p[1:].islower() and 3 <= len(p) - 1 <= 7 and p[1:] in vocab)
    pool = [w for w in pool if w not in family]
    if len(pool) < 120:
        raise RuntimeError(f"the tokenizer has {len(pool)} single-piece words, need 120")
    random.Random(2000 + seed).shuffle(pool)
    half = len(pool) // 2
    return pool[:half], [w + ".txt" for w in pool[half:]]


class _Turns:
    """The captured turns as text, and rows made from them with other names and words swapped in.

    A row's prompt is rebuilt from text: the instruction (and for second turns the first call
    and the tool result) replaced, then encoded; the captured ids round-trip, so unswapped text
    is exactly what the engine saw."""

    def __init__(self, tok: Any, records: list[dict]) -> None:
        from harness.tasks.lookup import lookup_tasks

        self.tok = tok
        meta = {t.full_name: t.metadata for t in lookup_tasks("train")}
        instr = {t.full_name: t.instruction.strip() for t in lookup_tasks("train")}
        self.captured = []
        for record in records:
            m = meta[record["task_id"]]
            first, second = self._tool_turns(record, m)
            p1 = round_trip_text(tok, first["prompt_token_ids"])
            c1 = tok.decode(first["completion_token_ids"], skip_special_tokens=False)
            p2 = round_trip_text(tok, second["prompt_token_ids"])
            c2 = tok.decode(second["completion_token_ids"], skip_special_tokens=False)
            # The second prompt must extend the first turn: its tail is the tool result.
            if not p2.startswith(p1 + c1.removesuffix("<|im_end|>")):
                raise RuntimeError(f"{record['task_id']}: the second prompt does not extend "
                                   "the first turn; the rows cannot be rebuilt from text")
            tail = p2[len(p1) + len(c1.removesuffix("<|im_end|>")):]
            self.captured.append({"meta": m, "instruction": instr[record["task_id"]],
                                  "p1": p1, "c1": c1, "tail": tail, "c2": c2})

    def _tool_turns(self, record: dict, m: dict) -> tuple[dict, dict]:
        """The captured `cat SOURCE` turn and the `echo WORD > TARGET` one: an agent may call the
        model for other things between them (opencode asks it for a title first)."""
        def turn(command: str) -> dict:
            for t in record["trace"]["turns"]:
                if command in self.tok.decode(t["completion_token_ids"]):
                    return t
            raise RuntimeError(f"{record['task_id']}: no captured turn holds {command!r}")

        return turn(f"cat {m['source']}"), turn(f"echo {m['value']} > {m['target']}")

    def _head(self, p1: str, instruction: str, cut: str) -> tuple[str, str]:
        """(text before the instruction, text after it) of a first prompt, per curriculum cut."""
        start = p1.index(instruction)
        if cut == "bare":
            return _BARE, _ASSIST
        if cut == "short":
            return p1[:start], _ASSIST
        return p1[:start], p1[start + len(instruction):]

    def rows(self, cut: str, swaps: list[dict]) -> list[tuple[list[int], list[int]]]:
        """First- and second-turn (prompt ids, completion ids) for each swap
        {"base": captured index, "source", "target", "value", "template"}, and optionally
        "cat" (the file the first call reads, when not the source: then no second turn) and
        "write" (the word the second call writes, when not the value)."""
        from harness.shared.lookup_names import TEMPLATES

        enc = lambda s: self.tok.encode(s, add_special_tokens=False)  # noqa: E731
        out = []
        for swap in swaps:
            cap = self.captured[swap["base"]]
            m = cap["meta"]
            instruction = TEMPLATES[swap["template"]].format(source=swap["source"],
                                                             target=swap["target"])
            before, after = self._head(cap["p1"], cap["instruction"], cut)
            p1 = before + instruction + after
            cat = swap.get("cat", swap["source"])
            c1 = cap["c1"].replace(f"cat {m['source']}", f"cat {cat}")
            tail = re.sub(rf"\b{m['value']}\b", swap["value"], cap["tail"])
            write = swap.get("write", swap["value"])
            c2 = cap["c2"].replace(f"echo {m['value']} > {m['target']}",
                                   f"echo {write} > {swap['target']}")
            if c1 == cap["c1"] and cat != m["source"] or \
                    c2 == cap["c2"] and (write, swap["target"]) != (m["value"], m["target"]):
                raise RuntimeError("a captured call does not hold the command to swap")
            out.append((enc(p1), enc(c1)))
            if cat == swap["source"]:
                out.append((enc(p1 + c1.removesuffix("<|im_end|>") + tail), enc(c2)))
        return out

    def swaps(self, count: int, words: list[str], names: list[str], rng: random.Random,
              *, wrong_first: float = 0.0, wrong_word: float = 0.0) -> list[dict]:
        """`count` swaps, then every captured turn as it was. A swap keeps at most one of the
        family's file names (its source with a synthetic target, or the reverse) and never a
        family (source, target) pair: the rows teach reading each name from the instruction,
        not which source goes with which target, and no dev or test pair is ever shown. A
        quarter of the words are the family's own, the rest synthetic.

        The noisy teacher: a `wrong_first` share of the swaps read another file first (a name
        from the same pool; only that first turn is a row), and a `wrong_word` share of the
        rest write another word than the one shown (from the same pool). The model learns a
        policy that reads and copies only that often: the starting point RL must improve on,
        by looking at the right file and writing what it saw."""
        from harness.shared.lookup_names import SOURCES, TARGETS, TEMPLATES, VALUES

        out = []
        for i in range(count):
            kind = i % 3
            source = rng.choice(SOURCES) if kind == 0 else rng.choice(names)
            target = rng.choice(TARGETS) if kind == 1 else rng.choice(
                [n for n in names if n != source])
            pool = VALUES if rng.random() < 0.25 else words
            value = rng.choice(pool)
            swap = {"base": rng.randrange(len(self.captured)), "source": source,
                    "target": target, "value": value, "template": rng.randrange(len(TEMPLATES))}
            if rng.random() < wrong_first:
                names_pool = SOURCES if source in SOURCES else names
                swap["cat"] = rng.choice([n for n in names_pool if n not in (source, target)])
            elif rng.random() < wrong_word:
                swap["write"] = rng.choice([w for w in pool if w != value])
            out.append(swap)
        out.extend({"base": b, "source": c["meta"]["source"], "target": c["meta"]["target"],
                    "value": c["meta"]["value"], "template": c["meta"]["template"]}
                   for b, c in enumerate(self.captured))
        return out


def _sample(model: Any, tok: Any, prompt: list[int], samples: int,
            prefix: PrefixSFT | None = None) -> list[str]:
    import torch

    if prefix is not None:  # an agent's long shared prompt: its keys and values computed once
        model.eval()
        replies = prefix.sample(prompt, samples)
        model.train()
        return [tok.decode(r, skip_special_tokens=False) for r in replies]
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([prompt])
        outs = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                              temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48,
                              num_return_sequences=samples, pad_token_id=tok.pad_token_id or 0,
                              eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"))
    model.train()
    return [tok.decode(o[len(prompt):], skip_special_tokens=False) for o in outs]


def probe(model: Any, turns: _Turns, split: str, samples: int,
          prefix: PrefixSFT | None = None) -> dict:
    """T=1 rates on `split`'s instructions (every one, one word each, captured bases): "first"
    (`cat SOURCE`), and given the right first turn "value", "target" and "second" (both)."""
    from harness.tasks.lookup import lookup_tasks

    tasks = {}
    for task in lookup_tasks(split):
        tasks.setdefault(task.metadata["instruction_id"], task.metadata)
    counts = dict.fromkeys(("first", "value", "target", "second"), 0)
    total = 0
    if prefix is not None:  # once: the weights do not change while probing
        model.eval()
        prefix.refresh()
    for i, meta in enumerate(sorted(tasks.values(), key=lambda m: m["instruction_id"])):
        swap = {"base": i % len(turns.captured), "source": meta["source"],
                "target": meta["target"], "value": meta["value"], "template": meta["template"]}
        (p1, _), (p2, _) = turns.rows("full", [swap])
        for reply in _sample(model, turns.tok, p1, samples, prefix):
            counts["first"] += _shell_command(reply) in (
                f"cat {meta['source']}", f"cat /app/{meta['source']}")
        for reply in _sample(model, turns.tok, p2, samples, prefix):
            command = _shell_command(reply)
            call = re.fullmatch(r"echo (\S+) > (?:/app/)?(\S+)", command) if command else None
            value, target = (call.group(1) == meta["value"], call.group(2) == meta["target"]) \
                if call else (False, False)
            counts["value"] += value
            counts["target"] += target
            counts["second"] += value and target
        total += samples
    return {**{k: round(v / total, 3) for k, v in counts.items()}, "n": total}


def probe_models(models: dict[str, Any], tok: Any, *, split: str = "dev", samples: int = 8,
                 seed: int = 0, harness: str = "mini-swe-agent",
                 log: Any = print) -> dict[str, dict]:
    """`probe` of each model on the same rows (the train traces captured once), each from the
    same torch seed: two models with the same weights get the same samples, so a difference
    between two probes is the weights', not the draw's (bench/learning/weights.py)."""
    import torch

    log(f"capturing scripted two-step solutions of the train instructions ({harness})")
    with tempfile.TemporaryDirectory(prefix="lookup-capture-") as scratch:
        records = capture_train_traces(Path(scratch), harness)
    turns = _Turns(tok, records)
    rates = {}
    for i, (name, model) in enumerate(models.items(), 1):
        torch.manual_seed(seed)
        rates[name] = probe(model, turns, split, samples)
        log(f"probed {i}/{len(models)} {name}: {rates[name]}")
    return rates


def build_lookup_model(out: Path, *, seed: int = SEED, bare_steps: int = BARE_STEPS,
                       short_steps: int = SHORT_STEPS, full_steps: int = FULL_STEPS,
                       synthetic_count: int = SYNTHETIC, lr: float = LR, samples: int = 8,
                       base: Path | None = None, threads: int = 2, wrong_first: float = WRONG_FIRST,
                       wrong_word: float = WRONG_WORD, calibrate_steps: int = CALIBRATE_STEPS,
                       calibrate_lr: float = CALIBRATE_LR, harness: str = "mini-swe-agent",
                       log: Any = print) -> dict:
    """Capture, SFT, calibrate and probe into `out` (an HF model dir); returns the build record.

    `harness`: whose prompts (captured through that agent's real CLI). Another agent than
    mini-swe-agent starts from its own create-file warm start, and its stages after the bare one
    run on a shared-prefix cache (harness/warm/agents.py's PrefixSFT: its ~10k-token system
    prompt and tools are the same in every row)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if base is None:
        from launchers.warm_models import committed_agent_warm_model, committed_warm_model

        base = committed_warm_model() if harness == "mini-swe-agent" else \
            committed_agent_warm_model(harness)
    with tempfile.TemporaryDirectory(prefix="lookup-capture-") as scratch:
        log(f"capturing scripted two-step solutions of the train instructions ({harness})")
        records = capture_train_traces(Path(scratch), harness)
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    turns = _Turns(tok, records)
    prefix = None
    if harness != "mini-swe-agent":
        every = [p for cut in ("short", "full") for p, _ in turns.rows(cut, turns.swaps(
            0, [], [], random.Random(0)))]
        prefix = PrefixSFT(model, shared_prefix(every), eos=tok.convert_tokens_to_ids(
            "<|im_end|>"))
        log(f"{len(prefix.prefix)} prompt tokens shared by every row (computed once a step)")
    before = probe(model, turns, "dev", samples, prefix)
    log(f"before SFT (dev): {before}")
    rng = random.Random(seed)
    words, names = synthetic_vocabulary(tok.get_vocab(), seed)
    # The copy is learnt from right rows only (a noisy teacher while it forms kept it from
    # forming); the noisy teacher speaks in the calibrating stage, which sets how often the
    # learnt skills are used.
    clean = turns.swaps(synthetic_count, words, names, random.Random(rng.random()))
    noisy = turns.swaps(synthetic_count, words, names, random.Random(rng.random()),
                        wrong_first=wrong_first, wrong_word=wrong_word)
    pad = tok.pad_token_id or 0

    def loss_of(cut: str) -> Any:
        if prefix is None or cut == "bare":
            return lambda batch: completion_loss(model, batch, pad)

        def cached(batch: list[tuple[list[int], list[int]]]) -> Any:
            prefix.refresh()  # the prefix's keys and values under this step's weights
            return prefix.loss(batch)
        return cached

    stages = [(f"{cut} prompt", cut, turns.rows(cut, clean), steps, lr)
              for cut, steps in (("bare", bare_steps), ("short", short_steps),
                                 ("full", full_steps))]
    stages.append(("calibrate, noisy teacher", "full", turns.rows("full", noisy),
                   calibrate_steps, calibrate_lr))
    for stage, cut, data, steps, stage_lr in stages:
        if steps:
            sft_steps(model, data, steps, loss_of(cut), rng=rng, lr=stage_lr, log=log,
                      stage=stage, log_every=50)
    after = {s: probe(model, turns, s, samples, prefix) for s in ("dev", "train")}
    log(f"after SFT: {after}")
    save_model(out, model, tok, base)
    return {"base": base.name, "harness": harness, "seed": seed, "bare_steps": bare_steps,
            "short_steps": short_steps, "full_steps": full_steps, "synthetic": synthetic_count,
            "lr": lr, "wrong_first": wrong_first, "wrong_word": wrong_word,
            "calibrate_steps": calibrate_steps, "calibrate_lr": calibrate_lr,
            "captured_rollouts": len(records),
            "probe": {"before": {"dev": before}, "after": after}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.warm.lookup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--harness", default="mini-swe-agent",
                        choices=("mini-swe-agent", *AGENTS),
                        help="whose prompts: capture through this agent's CLI and start from its "
                             "create-file warm start (default mini-swe-agent)")
    parser.add_argument("--commit", action="store_true",
                        help="write the result to models/tiny-qwen3-lookup (mini-swe-agent) or "
                             "models/tiny-qwen3-lookup-HARNESS")
    parser.add_argument("--out", type=Path, help="build into this directory instead")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--bare-steps", type=int, default=BARE_STEPS)
    parser.add_argument("--short-steps", type=int, default=None,
                        help=f"default {SHORT_STEPS} ({AGENT_DEFAULTS} for those agents)")
    parser.add_argument("--full-steps", type=int, default=FULL_STEPS)
    parser.add_argument("--synthetic", type=int, default=SYNTHETIC,
                        help="swapped rows with words and names from outside the family")
    parser.add_argument("--lr", type=float, default=LR)
    parser.add_argument("--wrong-first", type=float, default=WRONG_FIRST,
                        help="calibrating stage: share of taught first calls that read "
                             "another file")
    parser.add_argument("--wrong-word", type=float, default=WRONG_WORD,
                        help="calibrating stage: share of the other taught second calls that "
                             "write another word")
    parser.add_argument("--calibrate-steps", type=int, default=None,
                        help="after the clean stages, whole-prompt steps with the noisy teacher "
                             f"(0: none; default {CALIBRATE_STEPS}, or the agent's)")
    parser.add_argument("--calibrate-lr", type=float, default=CALIBRATE_LR,
                        help="learning rate of the calibrating stage")
    parser.add_argument("--base", type=Path, default=None,
                        help="start from this HF model dir (default: the create-file warm "
                             "start, models/tiny-qwen3-create-file)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads (1 is faster on a machine other jobs share)")
    args = parser.parse_args(argv)
    if not args.commit and args.out is None:
        parser.error("give --commit or --out DIR")
    defaults = {"short_steps": SHORT_STEPS, "calibrate_steps": CALIBRATE_STEPS,
                **AGENT_DEFAULTS.get(args.harness, {})}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    with tempfile.TemporaryDirectory(prefix="lookup-model-") as scratch:
        out = args.out or Path(scratch) / "model"
        record = build_lookup_model(out, seed=args.seed, bare_steps=args.bare_steps,
                                    short_steps=args.short_steps, full_steps=args.full_steps,
                                    synthetic_count=args.synthetic, lr=args.lr,
                                    base=args.base, threads=args.threads,
                                    wrong_first=args.wrong_first, wrong_word=args.wrong_word,
                                    calibrate_steps=args.calibrate_steps,
                                    calibrate_lr=args.calibrate_lr, harness=args.harness)
        directory = lookup_model_dir(args.harness)
        print(finish_build(out, record, directory if args.commit else None,
                           rebuild=lookup_rebuild_command(args.harness)))
        if args.commit and args.harness != "mini-swe-agent" and args.harness not in LOOKUP_AGENTS:
            print(f"add {args.harness!r} to LOOKUP_AGENTS (launchers/warm_models.py) to make it "
                  f"--harness {args.harness}'s default model on lookup:*")
    return 0


if __name__ == "__main__":
    sys.exit(main())
