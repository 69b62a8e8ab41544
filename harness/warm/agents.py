"""Warm starts for the agents whose prompts are not mini-swe-agent's: Codex, opencode, Claude Code.

Why it exists (issue 18 item 6): the default model (harness/warm/create_file.py) learnt to read the
create-file instruction inside mini-swe-agent's ~1,000-token prompt and to answer with its `bash`
call. Codex sends a 13.2k-token prompt and wants `exec_command` with a `cmd`; opencode sends
9.7k tokens and wants `bash`; Claude Code sends 21.0k tokens (with `--disable-slash-commands`;
harness/service/agents/claude_code.py) and wants `Bash` with a `command` and a `description`. On those
the default model answers with no call at all (a `--harness codex` run: 0 of 96 held-out before
and after, every group zero variance), so RL has nothing to move. This teaches it each agent's
own format the way the default was taught, from traces captured through the proxy:

1. capture: the scripted policy solves every *train* instance through the agent's real CLI
   (`capture_train_traces(harness=...)`); held-out instances are never captured.
2. SFT, starting from the default warm model (it already copies NAME and WORD from an
   instruction), on the 36 captured train first turns plus `synthetic_count` instructions from
   outside the family (`synthetic_instructions`), each swapped into a captured prompt, in up to
   three stages (`STEPS`): "bare", the instruction under a one-line system prompt answered with
   the agent's call (the call's shape, cheap); "short", the agent's prompt cut right after the
   instruction; "full", the agent's whole prompt.
3. probe: T=1 first turns on every held-out and train prompt, counted as harness/warm/create_file.py
   counts them (a pass is the shell call `echo WORD > NAME`; word and file apart).

Why a shared-prefix cache: every first turn of one agent is the same ~13-14k tokens (system
prompt, tools, environment) up to the instruction, and a fresh forward and backward of 13.2k
tokens costs 3.7 s on 2 cores (a few hundred batches of 8: hours). The prefix's keys and values
are computed once per step, without gradient, by the weights being trained, and each row runs
only its own tail against them; so the loss is exactly the whole sequence's (tested), and only
the gradient through the prefix's keys and values is left out. The RL trainer, which trains the
whole sequence, is what moves those.

Each build is committed under models/tiny-qwen3-create-file-{codex,opencode,claude-code}/ (1.3 MB
each, BUILD.json with every file's sha256) and is what `--model` resolves to for that `--harness`
(launchers/warm_models.py: AGENT_WARM_MODELS, `committed_agent_warm_model`):

    .venv/bin/python -m harness.warm.agents --harness codex --commit
    .venv/bin/python -m harness.warm.agents --harness opencode --commit
    .venv/bin/python -m harness.warm.agents --harness claude-code --commit

Measured 2026-12-02 (2 cores; 4 T=1 samples per prompt, 48 held-out and 144 train):
- Codex (200 bare + 250 full steps, 7.5 min after a 1 min capture): held-out pass 0% -> 42%
  (word 75%, file 42%, a well-formed call 100%), train 51%.
- opencode (200 bare + 80 full steps, 2.5 min after a 2.5 min capture): held-out pass 0% -> 27%
  (word 60%, file 42%, well-formed 98%), train 32%. Its instruction is the prompt's last message
  after a 9.7k-token shared prefix, so it learns fast: 40 full steps gave 4% (file 4%), 250 gave
  85%, which would leave RL little to show; 80 leaves it as much room as mini-swe-agent's start.
- Claude Code (200 bare + 150 full steps, 18 min after a 36 s capture; the full stage 7.2 s a
  step): held-out pass 0% -> 27% (word 50%, file 35%, well-formed 96%), train 33%. Before its
  skills were turned off the instruction was followed by ~3.4k tokens (21 s a step), and 200
  bare + 200 short + 60 full steps gave held-out pass 0%: it named files after the skill
  listing's words (`hello > mutexversion.txt`).
A rebuild on another day is not byte-identical: the agents put the date in their prompts.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness.warm.create_file import (
    _ASSIST,
    _BARE,
    capture_train_traces,
    completion_loss,
    finish_build,
    round_trip_text,
    save_model,
    sft_steps,
    synthetic_instructions,
    tally_first_turn,
)
from launchers.paths import REPO_ROOT
from launchers.warm_models import (
    AGENT_WARM_MODELS,
    AGENTS,
    committed_warm_model,
    rebuild_command,
)

__all__ = ["build_agent_warm_model", "PrefixSFT"]

LR, BATCH, SEED, SYNTHETIC = 2e-3, 8, 0, 600
# (bare, short, full) steps per agent. Codex's instruction is the prompt's last message, so its
# whole prompt is cheap once the prefix is cached; Claude Code's is followed by ~1k tokens (its
# environment, deferred tools, agent types) that every row runs, 7 s a step. opencode's 80 full
# steps leave RL room (250 reached 85% held-out; module docstring).
STEPS = {"codex": (200, 0, 250), "claude-code": (200, 0, 150), "opencode": (200, 0, 80)}
# A shell call's command in the agent's own argument (Codex `cmd`, the others `command`).
_COMMAND = re.compile(r'"(?:cmd|command)": "((?:[^"\\]|\\.)*)"')


class PrefixSFT:
    """SFT and sampling of first turns that share one long prompt prefix, on one model."""

    def __init__(self, model: Any, prefix: list[int], *, eos: int) -> None:
        import torch

        self.torch, self.model, self.prefix, self.eos = torch, model, prefix, eos
        self.cache: Any = None

    def refresh(self) -> None:
        """The prefix's keys and values under the current weights (no gradient)."""
        with self.torch.no_grad():
            ids = self.torch.tensor([self.prefix])
            self.cache = self.model(input_ids=ids, use_cache=True).cache

    def _tail_logits(self, tail: list[int]) -> Any:
        cache = copy.deepcopy(self.cache)  # the forward appends the tail to the cache it gets
        return self.model(input_ids=self.torch.tensor([tail]), cache=cache,
                          use_cache=True).logits[0]

    def loss(self, rows: list[tuple[list[int], list[int]]]) -> Any:
        """Mean cross-entropy over every completion token of `rows` ((prompt, completion), each
        prompt starting with the prefix), as one forward of each whole sequence would give."""
        torch = self.torch
        n = len(self.prefix)
        total, count = torch.zeros(()), 0
        for prompt, completion in rows:
            if prompt[:n] != self.prefix or len(prompt) == n:
                raise ValueError("a row's prompt does not extend the shared prefix")
            tail = prompt[n:]
            logits = self._tail_logits(tail + completion)
            # The logits at a position predict the next token: the last prompt token predicts
            # the completion's first.
            predicted = logits[len(tail) - 1:len(tail) + len(completion) - 1]
            total = total + torch.nn.functional.cross_entropy(
                predicted, torch.tensor(completion), reduction="sum")
            count += len(completion)
        return total / count

    def sample(self, prompt: list[int], samples: int, max_new: int = 48) -> list[list[int]]:
        """`samples` T=1 completions of `prompt` (it extends the prefix), stopped at eos."""
        torch = self.torch
        out = []
        with torch.no_grad():
            for _ in range(samples):
                cache = copy.deepcopy(self.cache)
                ids, reply = prompt[len(self.prefix):], []
                for _ in range(max_new):
                    logits = self.model(input_ids=torch.tensor([ids]), cache=cache,
                                        use_cache=True).logits[0, -1]
                    token = int(torch.multinomial(torch.softmax(logits.float(), -1), 1))
                    reply.append(token)
                    if token == self.eos:
                        break
                    ids = [token]
                out.append(reply)
        return out


def shared_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest token prefix every prompt starts with."""
    first = prompts[0]
    n = min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return first[:i]
    return first[:n]


class _AgentWarmStart:
    """The captured first turns of one agent, the synthetic ones, SFT and the probe."""

    def __init__(self, base: Path, records: list[dict], seed: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from harness.tasks.family import family_tasks

        torch.manual_seed(seed)
        self.torch, self.rng = torch, random.Random(seed)
        self.tok = AutoTokenizer.from_pretrained(base)
        self.model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        tasks = family_tasks("train") + family_tasks("heldout")
        self.meta = {t.full_name: t.metadata for t in tasks}
        self.instr = {t.full_name: t.instruction.strip() for t in tasks}
        self.first: dict[str, tuple[str, str]] = {}  # train task -> (prompt text, reply text)
        for record in records:
            meta = self.meta[record["task_id"]]
            call = f"echo {meta['word']} > {meta['file']}"
            turns = [t for t in record["trace"]["turns"]
                     if call in self.tok.decode(t["completion_token_ids"])]
            if not turns:
                raise RuntimeError(f"{record['task_id']}: no captured turn holds {call!r}")
            self.first[record["task_id"]] = (self._text(turns[0]["prompt_token_ids"]),
                                             self._text(turns[0]["completion_token_ids"]))

    def _text(self, ids: list[int]) -> str:
        return round_trip_text(self.tok, ids)

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def _swap(self, name: str, word: str, instruction: str) -> tuple[str, str]:
        """(prompt, reply) of the first captured turn with its instruction and call swapped."""
        src, (text, reply) = sorted(self.first.items())[0]
        call = f"echo {self.meta[src]['word']} > {self.meta[src]['file']}"
        if call not in reply or self.instr[src] not in text:
            raise RuntimeError(f"the captured first turn of {src} does not hold its instruction "
                               f"and the call {call!r}: the synthetic turns cannot be built")
        return (text.replace(self.instr[src], instruction),
                reply.replace(call, f"echo {word} > {name}"))

    def rows(self, synthetic_count: int, seed: int, cut: str = "full"
             ) -> list[tuple[list[int], list[int]]]:
        """(prompt, completion) ids of the train first turns and the synthetic ones: "full" the
        agent's whole prompt, "short" cut right after the instruction (cheaper where many
        tokens follow it: Claude Code's ~1k), "bare" the instruction alone under a one-line
        system prompt."""
        made = [(self.instr[t], text, reply) for t, (text, reply) in sorted(self.first.items())]
        made += [(instruction, *self._swap(name, word, instruction)) for name, word, instruction
                 in synthetic_instructions(self.tok.get_vocab(), synthetic_count, seed)]

        def prompt(instruction: str, text: str) -> str:
            if cut == "bare":
                return _BARE + instruction + _ASSIST
            if cut == "short":
                return text[:text.index(instruction) + len(instruction)] + _ASSIST
            return text

        return [(self._ids(prompt(instruction, text)), self._ids(reply))
                for instruction, text, reply in made]

    def probe_prompts(self, split: str) -> dict[str, list[int]]:
        if split == "train":
            return {t: self._ids(text) for t, (text, _) in sorted(self.first.items())}
        return {t: self._ids(self._swap(self.meta[t]["file"], self.meta[t]["word"],
                                        self.instr[t])[0])
                for t in sorted(self.meta) if self.meta[t]["split"] == "heldout"}

    def sft(self, steps: int, data: list[tuple[list[int], list[int]]], *, lr: float,
            prefix: PrefixSFT | None, log: Any, stage: str) -> None:
        def loss_of(batch: list[tuple[list[int], list[int]]]) -> Any:
            if prefix is None:
                return completion_loss(self.model, batch, self.tok.pad_token_id or 0)
            prefix.refresh()  # the prefix's keys and values under this step's weights
            return prefix.loss(batch)

        sft_steps(self.model, data, steps, loss_of, rng=self.rng, lr=lr, log=log, stage=stage,
                  log_every=25, batch_size=BATCH)

    def probe(self, split: str, samples: int, prefix: PrefixSFT) -> dict:
        """First-turn rates at T=1: {"pass", "word", "file", "formed", "n"}, as
        harness/warm/create_file.py counts them (a pass: the shell call `echo WORD > NAME`)."""
        self.model.eval()
        prefix.refresh()
        counts = dict.fromkeys(("pass", "word", "file", "formed"), 0)
        total = 0
        for task, prompt in self.probe_prompts(split).items():
            meta = self.meta[task]
            for ids in prefix.sample(prompt, samples):
                reply = self.tok.decode(ids, skip_special_tokens=False)
                total += 1
                found = _COMMAND.search(reply) if "</tool_call>" in reply else None
                tally_first_turn(counts, found.group(1) if found else None, meta)
        self.model.train()
        return {**{k: round(v / total, 3) for k, v in counts.items()}, "n": total}


def build_agent_warm_model(harness: str, out: Path, *, seed: int = SEED,
                           steps: tuple[int, int, int] | None = None,
                           synthetic_count: int = SYNTHETIC, lr: float = LR, samples: int = 4,
                           records: list[dict] | None = None, log: Any = print) -> dict:
    """Capture (unless `records` are given), SFT and probe into `out`; returns the build record."""
    import torch

    torch.set_num_threads(2)
    bare_steps, short_steps, full_steps = steps or STEPS[harness]
    base = committed_warm_model()
    if records is None:
        with tempfile.TemporaryDirectory(prefix="warm-capture-") as scratch:
            log(f"capturing scripted solutions of the train instances (real {harness}) ...")
            records = capture_train_traces(Path(scratch), harness)
    warm = _AgentWarmStart(base, records, seed)
    full = warm.rows(synthetic_count, seed)
    short = warm.rows(synthetic_count, seed, "short")
    everything = ([p for p, _ in full + short]
                  + list(warm.probe_prompts("heldout").values()))
    prefix = PrefixSFT(warm.model, shared_prefix(everything), eos=warm.eos)
    log(f"{len(full)} first turns, {len(prefix.prefix)} prompt tokens shared, tails "
        f"{min(len(p) for p, _ in full) - len(prefix.prefix)}-"
        f"{max(len(p) for p, _ in full) - len(prefix.prefix)}")
    before = {s: warm.probe(s, samples, prefix) for s in ("heldout", "train")}
    log(f"before: {before}")
    warm.sft(bare_steps, warm.rows(synthetic_count, seed, "bare"), lr=lr, prefix=None,
             log=log, stage="bare instruction, the agent's call")
    warm.sft(short_steps, short, lr=lr, prefix=prefix, log=log,
             stage="the agent's prompt cut after the instruction")
    warm.sft(full_steps, full, lr=lr, prefix=prefix, log=log, stage="the agent's whole prompt")
    after = {s: warm.probe(s, samples, prefix) for s in ("heldout", "train")}
    log(f"after: {after}")
    save_model(out, warm.model, warm.tok, base)
    return {"base": base.name, "harness": harness, "seed": seed, "bare_steps": bare_steps,
            "short_steps": short_steps, "full_steps": full_steps, "synthetic": synthetic_count,
            "lr": lr,
            "captured_rollouts": len(records), "shared_prefix_tokens": len(prefix.prefix),
            "first_turn_probe": {"before": before, "after": after}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.warm.agents",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--harness", required=True, choices=AGENTS)
    parser.add_argument("--commit", action="store_true",
                        help="write the result to models/tiny-qwen3-create-file-HARNESS")
    parser.add_argument("--out", type=Path, help="build into this directory instead")
    parser.add_argument("--records", type=Path,
                        help="a JSON list of captured rollout records to reuse (skips capture)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--steps", type=int, nargs=3, metavar=("BARE", "SHORT", "FULL"),
                        help=f"SFT steps of each stage (default: {STEPS})")
    parser.add_argument("--synthetic", type=int, default=SYNTHETIC)
    parser.add_argument("--lr", type=float, default=LR)
    args = parser.parse_args(argv)
    if not args.commit and args.out is None:
        parser.error("give --commit or --out DIR")
    records = json.loads(args.records.read_text()) if args.records else None
    with tempfile.TemporaryDirectory(prefix="warm-agent-model-") as scratch:
        out = args.out or Path(scratch) / "model"
        record = build_agent_warm_model(
            args.harness, out, seed=args.seed, steps=tuple(args.steps) if args.steps else None,
            synthetic_count=args.synthetic, lr=args.lr,
            records=records)
        directory = REPO_ROOT / "models" / f"tiny-qwen3-create-file-{args.harness}"
        print(finish_build(out, record, directory if args.commit else None,
                           rebuild=rebuild_command(args.harness)))
        if args.commit and args.harness not in AGENT_WARM_MODELS:
            print(f"add {args.harness!r} to AGENT_WARM_MODELS (launchers/warm_models.py) to "
                  f"make it --harness {args.harness}'s default model")
    return 0


if __name__ == "__main__":
    sys.exit(main())
