"""The default model: the tiny model warm-started on the create-file family's *train* instances.

Why it exists (issue 18 item 4): the committed tiny model (launchers/tiny_model.py) knows the
agent format, not the tasks, and scores 0% on the create-file family (harness/tasks/family.py)
with mini-swe-agent; GRPO from 0% does not move (/work/shared/LEARNING.md). This builds the model
`python -m harness.train` starts from by supervised fine-tuning on traces *captured through the
capture proxy*, the path a user takes to distil a stronger policy's rollouts into a model before
RL:

1. capture: a scripted policy (harness/audit/scripted_engine.py: prompt ids are the tiny tokenizer's
   rendering of each request, as vLLM's) solves every *train* instance through the real
   mini-swe-agent CLI, the capture proxy, bubblewrap and the real verifiers. Held-out instances
   are never captured and never trained on: what the model learns to do on them it must get by
   reading their instruction (their (name, word) pairs occur in no train instance).
2. SFT (plain torch, loss on completion tokens only), LEARNING.md's curriculum in three stages,
   each on the 36 captured first turns plus `synthetic_count` instructions whose words and names
   come from outside the family (`synthetic_instructions`): `bare_steps` on the instruction
   alone under a one-line system prompt (copying NAME and WORD is learnt here, ~60 tokens a
   row), `short_steps` on the captured prompt cut right after the instruction (after
   mini-swe-agent's system prompt), then `full_steps` on the whole prompt (the instruction
   ~1,000 tokens before its end), first turns and second turns (the submit call) mixed.
3. probe: T=1 samples of the first turn for every train and held-out prompt (a held-out prompt is
   a train prompt with its instruction swapped, exact because the ids round-trip through the
   tokenizer); a pass is the tool call `echo WORD > NAME` for that instance, and the word and
   the file right are counted apart.

The probe's figures go into BUILD.json. They are first turns only; what a whole episode scores is
`harness.train`'s "before" evaluation. The target is the band where GRPO has room to move
(LEARNING.md: 20-40% held-out) with the model reading the instruction, not the highest score.

Why the synthetic instructions: trained on the 36 train instances alone (4 words, 4 names), the
model fits pairs instead of reading. That build named the held-out word 19% of the time (chance:
25%) and the file 82%; RL then moved it toward the words the train pairs favour, and held-out
fell (27% -> 12%). The bare stage alone, without synthetic words, reached 92% held-out on the
bare prompt but kept the word at 46% once the whole prompt came back, train 66% (memorised).
With 600 synthetic instructions the model names the held-out word 94% of the time.

The result is committed under models/tiny-qwen3-create-file/ (1.3 MB of weights, BUILD.json with
every file's sha256, checked each time it is used) so every machine trains the same bytes and
set-up builds nothing:

    .venv/bin/python -m harness.warm.create_file --commit    # ~5 min on 2 cores
    .venv/bin/python -m harness.warm.create_file --out DIR   # build elsewhere, print the probe

(launchers/warm_models.py holds the committed folder and its hash check, `committed_warm_model`:
what `--model` resolves to needs no builder.)

Measured 2026-12-01 (2 cores; 4 T=1 samples per prompt, so 48 held-out and 144 train samples,
+-6-7 points of standard error): the tiny model before SFT, held-out 0%, train 0%; the
committed build (800 bare + 150 short + 100 full steps, 600 synthetic instructions): held-out
pass 21% (word 83%, file 29%), train pass 42% (word 88%, file 45%); the same weights probed with
other samples read held-out 33% (word 94%, file 35%). It reads the word and is unsure of the
file: what GRPO has to sharpen, on train and held-out pairs alike. It does not end an episode
(the exact submit call on 0% of second turns). Seeded: a rebuild gave the same
model.safetensors byte for byte. Capture: 36 of 36 scripted rollouts passed their verifier.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launchers.tiny_model import build_tiny_model
from launchers.warm_models import REBUILD, WARM_MODEL

__all__ = ["build_warm_model", "synthetic_instructions"]

BARE_STEPS, SHORT_STEPS, FULL_STEPS, LR, BATCH, SEED = 800, 150, 100, 2e-3, 8, 0
SYNTHETIC = 600  # first turns whose words and names come from outside the family
_ASSIST = "<|im_end|>\n<|im_start|>assistant\n"
# The bare prompt of the first stage: LEARNING.md's one-line system prompt, then the instruction.
_BARE = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
         "Please solve this issue: ")
_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def capture_train_traces(out: Path, harness: str = "mini-swe-agent") -> list[dict]:
    """Scripted solutions of every train instance, captured through the real stack (step 1):
    the `harness` agent's CLI, its own prompts and tool schema, the proxy, the verifiers."""
    from harness.audit.scripted_engine import shell_call
    from harness.tasks.family import family_tasks

    tasks = family_tasks("train")
    by_instruction = {t.instruction.strip(): t.metadata for t in tasks}

    def policy(request: dict) -> str:
        if not request.get("tools"):  # an agent's side call (Claude Code's title)
            return "A title"
        if any(m.get("role") == "tool" for m in request["messages"]):
            # mini-swe-agent ends an episode with its submit command; the others by answering.
            return shell_call(request, _SUBMIT) if harness == "mini-swe-agent" else "Done."
        text = json.dumps(request["messages"])
        meta = next(m for i, m in by_instruction.items() if json.dumps(i)[1:-1] in text)
        return shell_call(request, f"echo {meta['word']} > {meta['file']}")

    return record_scripted_rollouts(policy, tasks, out, harness=harness, max_steps=4)


def record_scripted_rollouts(policy: Any, tasks: list, out: Path, *, harness: str, max_steps: int,
                             min_turns: int = 1) -> list[dict]:
    """Run `policy` (request -> reply text) as the engine behind the real proxy, one rollout per
    task through the `harness` agent's CLI, and return the full records sorted by task.

    Refuses to return a set in which any rollout failed, was lost or took fewer than
    `min_turns` engine calls: those traces would teach failure."""
    from capture import CaptureServer
    from harness.audit.scripted_engine import ScriptedEngine
    from harness.service.factory import HarborSessionFactory
    from harness.shared.run_records import RecordingFactory

    with ScriptedEngine(build_tiny_model(), policy) as engine, CaptureServer(engine.url) as proxy:
        factory = RecordingFactory(HarborSessionFactory(
            proxy.admin_url, admin_key=proxy.admin_key, split=tasks, harness=harness,
            llm_url=engine.url, model="tiny", sampling={"temperature": 1.0, "max_tokens": 256},
            max_concurrent_rollouts=4, agent_timeout_s=150, max_steps=max_steps), out)

        async def run_all() -> None:
            await asyncio.gather(*(factory.rollout(seed=i) for i in range(len(tasks))))

        try:
            asyncio.run(run_all())
        finally:
            factory.close()
    # The full records (trace included) are the files; factory.records holds their index lines.
    # Sorted by task: the files are numbered in finishing order, which varies from run to run,
    # and the SFT batches are drawn from this order by a seeded generator.
    records = sorted((json.loads(p.read_text()) for p in (out / "rollouts").glob("*.json")),
                     key=lambda r: r["task_id"])
    failed = [r["task_id"] for r in records if (r["env_reward"] or 0) < 1 or not r["trace"]
              or len(r["trace"]["turns"]) < min_turns]
    if failed or len(records) != len(tasks):
        raise RuntimeError(f"the scripted policy failed {failed} ({len(records)} of {len(tasks)} "
                           "recorded): its traces would teach failure")
    return records


def synthetic_instructions(vocab: Iterable[str], count: int, seed: int
                           ) -> list[tuple[str, str, str]]:
    """`count` (name, word, instruction) of the family's templates, with words and names from
    outside the family.

    Why: 36 train instances over 4 words let SFT fit pairs instead of reading the word (the
    previous build named the held-out word 19% of the time, below chance). Hundreds of words
    the model cannot memorise make copying from the instruction the only fit. They are drawn
    from the tokenizer's vocabulary `vocab` (byte-level BPE pieces: lowercase words of 3-7
    letters, single and joined in pairs), never a family word or name.
    """
    from harness.tasks.family import NAMES, TEMPLATES, WORDS

    rng = random.Random(1000 + seed)
    family = set(WORDS) | {Path(n).stem for n in NAMES}
    pool = sorted({piece[1:] for piece in vocab if piece.startswith("Ġ")
                   and piece[1:].isalpha() and piece[1:].islower()
                   and 3 <= len(piece) - 1 <= 7} - family)
    if len(pool) < 360:
        raise RuntimeError(f"the tokenizer has {len(pool)} lowercase word pieces, the "
                           "synthetic instructions need 360")
    rng.shuffle(pool)
    words = pool[:60] + [a + b for a, b in zip(pool[120:180], pool[180:240], strict=True)]
    names = ([w + ".txt" for w in pool[60:120]]
             + [f"{a}_{b}.txt" for a, b in zip(pool[240:300], pool[300:360], strict=True)])
    clash = (set(words) | {Path(n).stem for n in names}) & family
    if clash:  # a joined pair can spell a family word: it would teach a held-out answer
        raise RuntimeError(f"synthetic words or names {sorted(clash)} are the family's")
    out = []
    for _ in range(count):
        name, word = rng.choice(names), rng.choice(words)
        out.append((name, word, TEMPLATES[rng.randrange(len(TEMPLATES))].format(name=name,
                                                                                 word=word)))
    return out


def tally_first_turn(counts: dict[str, int], command: str | None, meta: dict) -> None:
    """Count one sampled first turn into `counts`: "formed" (a shell call, its command given),
    "word" and "file" (each half of `echo WORD > NAME` right on its own), "pass" (both)."""
    call = re.fullmatch(r"echo (\S+) > (?:/app/)?(\S+)", command.strip()) if command else None
    word, file = (call.group(1) == meta["word"], call.group(2) == meta["file"]) if call \
        else (False, False)
    counts["formed"] += command is not None
    counts["word"] += word
    counts["file"] += file
    counts["pass"] += word and file


def round_trip_text(tok: Any, ids: list[int]) -> str:
    """The text of captured token ids, refused unless it encodes back to exactly those ids (a
    prompt rebuilt from text must be the one the engine saw)."""
    text = tok.decode(ids, skip_special_tokens=False)
    if tok.encode(text, add_special_tokens=False) != ids:
        raise RuntimeError("a captured turn does not round-trip through the tokenizer")
    return text


def completion_loss(model: Any, batch: list[tuple[list[int], list[int]]], pad: int) -> Any:
    """Mean cross-entropy over the completion tokens of (prompt, completion) rows, padded."""
    import torch

    width = max(len(p) + len(c) for p, c in batch)
    ids = torch.full((len(batch), width), pad)
    labels = torch.full((len(batch), width), -100)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (p, c) in enumerate(batch):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        mask[i, :len(p) + len(c)] = 1
        labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


def sft_steps(model: Any, data: list[tuple[list[int], list[int]]], steps: int,
              loss_of: Any, *, rng: random.Random, lr: float, log: Any, stage: str,
              log_every: int, batch_size: int = BATCH) -> None:
    """`steps` AdamW steps, each on `batch_size` rows drawn by `rng` (so a seeded build is
    the same build), the loss being `loss_of(batch)`, gradients clipped to norm 1."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    started = time.monotonic()
    for step in range(1, steps + 1):
        loss = loss_of(rng.sample(data, min(batch_size, len(data))))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == steps:
            log(f"  {stage}, step {step}/{steps}: loss {loss.item():.3f} "
                f"({time.monotonic() - started:.0f} s)")


def save_model(out: Path, model: Any, tok: Any, base: Path) -> None:
    """An HF model dir: the weights, the tokenizer and the base's chat template."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    for name in ("chat_template.jinja", "generation_config.json"):
        if (base / name).exists():
            shutil.copy(base / name, out / name)


class _Trainer:
    """SFT and the probe on one model (steps 2 and 3)."""

    def __init__(self, base: Path, records: list[dict], seed: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from harness.tasks.family import family_tasks

        self.torch = torch
        torch.manual_seed(seed)
        self.rng = random.Random(seed)
        self.tok = AutoTokenizer.from_pretrained(base)
        self.model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        self.eos = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.pad = self.tok.pad_token_id or 0
        tasks = family_tasks("train") + family_tasks("heldout")
        self.meta = {t.full_name: t.metadata for t in tasks}
        self.instr = {t.full_name: t.instruction.strip() for t in tasks}
        self.first: dict[str, tuple[str, list[int]]] = {}  # train task -> (prompt, completion)
        self.second: list[tuple[list[int], list[int]]] = []  # (prompt, the submit call)
        for record in records:
            first, second = record["trace"]["turns"][:2]
            self.first[record["task_id"]] = (self._text(first["prompt_token_ids"]),
                                             first["completion_token_ids"])
            self.second.append((second["prompt_token_ids"], second["completion_token_ids"]))
        src, (src_text, _) = next(iter(sorted(self.first.items())))
        self.heldout = {t: src_text.replace(self.instr[src], self.instr[t]) for t in self.meta
                        if self.meta[t]["split"] == "heldout"}

    def _text(self, ids: list[int]) -> str:
        return round_trip_text(self.tok, ids)

    def _prompt(self, text: str, instruction: str, cut: str = "full") -> list[int]:
        """The ids of a first-turn prompt: "full" as captured, "short" cut right after the
        instruction, "bare" the instruction alone under a one-line system prompt."""
        if cut == "bare":
            text = _BARE + instruction + _ASSIST
        elif cut == "short":
            text = text[:text.index(instruction) + len(instruction)] + _ASSIST
        return self.tok.encode(text, add_special_tokens=False)

    def synthetic(self, count: int, seed: int) -> list[tuple[str, str, list[int]]]:
        """`count` first turns for `synthetic_instructions`: (prompt text, instruction,
        completion ids), built as the held-out probe prompts are: a captured train prompt with
        its instruction swapped, its completion with the call's word and name swapped."""
        src, (text, completion) = sorted(self.first.items())[0]
        reply = self.tok.decode(completion, skip_special_tokens=False)
        call = f"echo {self.meta[src]['word']} > {self.meta[src]['file']}"
        # A swap that finds nothing would teach the source's answer for every instruction.
        if call not in reply or self.instr[src] not in text:
            raise RuntimeError(f"the captured first turn of {src} does not hold its instruction "
                               f"and the call {call!r}: the synthetic turns cannot be built")
        return [(text.replace(self.instr[src], instruction), instruction,
                 self.tok.encode(reply.replace(call, f"echo {word} > {name}"),
                                 add_special_tokens=False))
                for name, word, instruction in synthetic_instructions(
                    self.tok.get_vocab(), count, seed)]

    def first_turns(self, cut: str, synthetic: list[tuple[str, str, list[int]]]
                    ) -> list[tuple[list[int], list[int]]]:
        """(prompt, completion) of every captured train first turn, then the synthetic ones."""
        return ([(self._prompt(text, self.instr[t], cut), c)
                 for t, (text, c) in sorted(self.first.items())]
                + [(self._prompt(text, instruction, cut), c)
                   for text, instruction, c in synthetic])

    def sft(self, steps: int, data: list[tuple[list[int], list[int]]], *, lr: float, log: Any,
            stage: str) -> None:
        sft_steps(self.model, data, steps, lambda batch: completion_loss(self.model, batch,
                                                                       self.pad),
                  rng=self.rng, lr=lr, log=log, stage=stage, log_every=50)

    def probe(self, split: str, samples: int) -> dict:
        """First-turn rates at T=1 on the whole prompt: {"pass", "word", "file", "formed", "n"}.

        A pass is the tool call `echo WORD > NAME`; "word" and "file" count each half right on
        its own, which tells reading the word from reading the name (chance is 1 in 4 each)."""
        texts = self.heldout if split == "heldout" else {t: v[0] for t, v in self.first.items()}
        counts = dict.fromkeys(("pass", "word", "file", "formed"), 0)
        total = 0
        for task, text in sorted(texts.items()):
            meta = self.meta[task]
            for reply in self._sample(self._prompt(text, self.instr[task]), samples):
                total += 1
                found = re.search(r'"command": "(.*?)"\}\}\n</tool_call>', reply)
                tally_first_turn(counts, found.group(1) if found else None, meta)
        return {**{k: round(v / total, 3) for k, v in counts.items()}, "n": total}

    def probe_submit(self, samples: int) -> dict:
        """Second turns at T=1: the share that is exactly the submit command."""
        replies = [r for prompt, _ in self.second[::3] for r in self._sample(prompt, samples)]
        ok = sum(f'"command": "{_SUBMIT}"' in r for r in replies)
        return {"submit": round(ok / len(replies), 3), "n": len(replies)}

    def _sample(self, prompt: list[int], samples: int) -> list[str]:
        """`samples` T=1 completions of `prompt`, decoded with their markup."""
        torch = self.torch
        self.model.eval()
        with torch.no_grad():
            ids = torch.tensor([prompt])
            outs = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                top_k=0, top_p=1.0, max_new_tokens=48, num_return_sequences=samples,
                pad_token_id=self.pad, eos_token_id=self.eos)
        self.model.train()
        return [self.tok.decode(out[len(prompt):], skip_special_tokens=False) for out in outs]


def build_warm_model(out: Path, *, seed: int = SEED, bare_steps: int = BARE_STEPS,
                     short_steps: int = SHORT_STEPS, full_steps: int = FULL_STEPS,
                     synthetic_count: int = SYNTHETIC, lr: float = LR, samples: int = 4,
                     log: Any = print) -> dict:
    """Capture, SFT and probe into `out` (an HF model dir); returns the build record."""
    import torch

    torch.set_num_threads(2)
    base = build_tiny_model()
    with tempfile.TemporaryDirectory(prefix="warm-capture-") as scratch:
        log("capturing scripted solutions of the train instances (real mini-swe-agent) ...")
        records = capture_train_traces(Path(scratch))
    trainer = _Trainer(base, records, seed)
    before = {s: trainer.probe(s, samples) for s in ("heldout", "train")}
    log(f"before SFT: {before}")
    synthetic = trainer.synthetic(synthetic_count, seed)
    # LEARNING.md's curriculum: copying is learnt on the bare instruction (cheap: ~60 tokens a
    # row), then found after mini-swe-agent's system prompt, then ~1,000 tokens further back.
    trainer.sft(bare_steps, trainer.first_turns("bare", synthetic), lr=lr, log=log,
                stage="bare instruction")
    trainer.sft(short_steps, trainer.first_turns("short", synthetic), lr=lr, log=log,
                stage="prompt cut after the instruction")
    # The whole prompt, first turns and second turns (after the command's output, the submit
    # call) mixed: every second turn has the same answer, and mixing them in kept the full stage
    # from memorising the train pairs. The tiny model still garbles the long
    # submit string (second_turn below), so the CPU default runs one agent step on this family
    # (harness/shared/run_config.py).
    trainer.sft(full_steps, trainer.first_turns("full", synthetic) + trainer.second, lr=lr,
                log=log, stage="full prompt, both turns")
    after = {s: trainer.probe(s, samples) for s in ("heldout", "train")}
    after["second_turn"] = trainer.probe_submit(samples)
    log(f"after SFT: {after}")
    save_model(out, trainer.model, trainer.tok, base)
    return {"base": base.name, "seed": seed, "bare_steps": bare_steps,
            "short_steps": short_steps, "full_steps": full_steps, "synthetic": synthetic_count,
            "lr": lr, "captured_rollouts": len(records),
            "first_turn_probe": {"before": before, "after": after}}


def commit(built: Path, record: dict, directory: Path = WARM_MODEL, rebuild: str = REBUILD
           ) -> Path:
    import hashlib

    import torch

    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(built, staging)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(staging.iterdir()) if p.is_file()}
    (staging / "BUILD.json").write_text(json.dumps(
        {**record, "torch": torch.__version__, "built_by": rebuild, "files": files}, indent=1)
        + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.warm.create_file",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--commit", action="store_true", help=f"write the result to {WARM_MODEL}")
    parser.add_argument("--out", type=Path, help="build into this directory instead")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--bare-steps", type=int, default=BARE_STEPS)
    parser.add_argument("--short-steps", type=int, default=SHORT_STEPS)
    parser.add_argument("--full-steps", type=int, default=FULL_STEPS)
    parser.add_argument("--synthetic", type=int, default=SYNTHETIC,
                        help="first turns with words and names from outside the family")
    parser.add_argument("--lr", type=float, default=LR)
    args = parser.parse_args(argv)
    if not args.commit and args.out is None:
        parser.error("give --commit or --out DIR")
    with tempfile.TemporaryDirectory(prefix="warm-model-") as scratch:
        out = args.out or Path(scratch) / "model"
        record = build_warm_model(out, seed=args.seed, bare_steps=args.bare_steps,
                                  short_steps=args.short_steps, full_steps=args.full_steps,
                                  synthetic_count=args.synthetic, lr=args.lr)
        print(finish_build(out, record, WARM_MODEL if args.commit else None))
    return 0


def finish_build(out: Path, record: dict, directory: Path | None, rebuild: str = REBUILD
                 ) -> Path:
    """Commit the build in `out` to `directory` (hashed BUILD.json), or, with no directory,
    leave it in `out` with its BUILD.json; returns where it is."""
    if directory is not None:
        return commit(out, record, directory, rebuild=rebuild)
    (out / "BUILD.json").write_text(json.dumps(record, indent=1) + "\n")
    return out


if __name__ == "__main__":
    sys.exit(main())
