"""Can SFT on proxy-captured traces teach the tiny model to read the instruction? (issue 18 item 4)

    PYTHONPATH=. .venv/bin/python bench/learning/warm_start_probe.py OUT [--task-last]
        [--short-steps 300] [--full-steps 100] [--lr 2e-3] [--save DIR]

1. capture: a scripted policy (tests/scripted_engine.py replies; the prompt ids are the tiny
   tokenizer's rendering, as vLLM's) solves every *train* instance of the create-file family
   (harness/tasks/family.py) through the real mini-swe-agent CLI, the capture proxy, bubblewrap
   and the real verifiers; the TrainingTraces land in OUT/capture/rollouts/*.json. Held-out
   instances are never captured: their probe prompts are a train prompt with its instruction
   swapped for the held-out one (exact: the ids round-trip through the tokenizer).
2. SFT (plain torch, loss on completion tokens), a curriculum as in /work/shared/LEARNING.md:
   `--short-steps` on the prompt cut right after the instruction, then `--full-steps` on the
   whole prompt (first turns only).
3. probe: T=1 samples of the first turn for every train / held-out prompt; a pass is the tool
   call `echo WORD > NAME` for that instance's pair.

Measured 2026-12-01 (2 cores, load 9-12, nice 19; 4 T=1 samples per prompt, so 48 held-out and
144 train samples: +-6-7 points of standard error; mini-swe-agent's default prompt is ~1,320
tokens with the task ~1,000 tokens before its end; capture: 36 of 36 scripted rollouts passed):
    committed tiny model, no SFT      held-out 0%, train 0%, well-formed calls 49-73%
    this script, default prompt       short 300 steps: held-out 73%, train 99% (short prompts)
                                      + full 100 steps: held-out 23-31%, train 51-53%, 100% formed
    this script, --task-last          short 300 steps: held-out 77%, train 100% (short prompts)
                                      + full 100 steps: held-out 88-90%, train 100%
    (a first try, /tmp-only, that trained the full prompt on first AND second turns after the
     short stage fell to held-out 2% / train 4% at step 100; SFT on the full prompt alone from
     the committed model: 10% at step 100, 2% at step 200, about chance, which is 1/16)
So a 2-layer model copies NAME and WORD out of the agent's real prompt after ~2 min of SFT on
traces of the train pairs only, landing in the 20-40% band LEARNING.md found right for GRPO;
with the task at the end of the prompt it is too good (88-90%) to leave RL room. Each SFT step
is ~0.1-0.3 s here. `--task-last` only rewrites the captured prompts for this probe; the agent
itself still sends its default template.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ASSIST = "<|im_end|>\n<|im_start|>assistant\n"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def capture(out: Path) -> None:
    from capture import CaptureServer
    from harness.factory import HarborSessionFactory
    from harness.run_records import RecordingFactory
    from harness.tasks.family import family_tasks
    from launchers.tiny_model import build_tiny_model
    from tests.scripted_engine import ScriptedEngine, shell_tool_name, tool_call

    tasks = family_tasks("train")
    by_instruction = {t.instruction.strip(): t.metadata for t in tasks}

    def policy(request: dict) -> str:
        name = shell_tool_name(request)
        if any(m.get("role") == "tool" for m in request["messages"]):
            return tool_call(name, command=SUBMIT)
        text = json.dumps(request["messages"])
        meta = next(m for i, m in by_instruction.items() if json.dumps(i)[1:-1] in text)
        return tool_call(name, command=f"echo {meta['word']} > {meta['file']}")

    with ScriptedEngine(build_tiny_model(), policy) as engine, CaptureServer(engine.url) as proxy:
        factory = RecordingFactory(HarborSessionFactory(
            proxy.admin_url, admin_key=proxy.admin_key, split=tasks, harness="mini-swe-agent",
            llm_url=engine.url, model="tiny", sampling={"temperature": 1.0, "max_tokens": 256},
            max_concurrent_rollouts=4, agent_timeout_s=150, max_steps=4), out)

        async def run_all() -> None:
            await asyncio.gather(*(factory.rollout(seed=i) for i in range(len(tasks))))

        try:
            asyncio.run(run_all())
        finally:
            factory.close()
    passed = sum((r["env_reward"] or 0) >= 1 for r in factory.records)
    print(f"captured {len(factory.records)} scripted rollouts, {passed} passed their verifier")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--task-last", action="store_true")
    parser.add_argument("--short-steps", type=int, default=300)
    parser.add_argument("--full-steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--samples", type=int, default=4, help="T=1 samples per probe prompt")
    parser.add_argument("--save", type=Path, help="write the SFT model here (an HF model dir "
                        "that --model takes)")
    args = parser.parse_args()
    if not glob.glob(str(args.out / "capture" / "rollouts" / "*.json")):
        capture(args.out / "capture")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.tasks.family import family_tasks
    from launchers.tiny_model import build_tiny_model

    torch.set_num_threads(2)
    base = build_tiny_model()
    tok = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id or 0
    meta = {t.full_name: t.metadata for t in family_tasks("train") + family_tasks("heldout")}
    instr = {t.full_name: t.instruction.strip()
             for t in family_tasks("train") + family_tasks("heldout")}

    def text_of(ids: list[int]) -> str:
        text = tok.decode(ids, skip_special_tokens=False)
        assert tok.encode(text, add_special_tokens=False) == ids, "prompt does not round-trip"
        return text

    def variant(text: str, task: str, kind: str) -> list[int]:
        if kind == "short":
            text = text[:text.index(instr[task]) + len(instr[task])] + ASSIST
        elif kind == "full" and args.task_last:
            text = text.replace("Please solve this issue: " + instr[task],
                                "Please solve the issue given at the end.")
            text = text[:-len(ASSIST)] + "\n\nThe issue: " + instr[task] + ASSIST
        return tok.encode(text, add_special_tokens=False)

    first: dict[str, tuple[str, list[int]]] = {}  # task -> (prompt text, completion ids)
    for path in sorted(glob.glob(str(args.out / "capture" / "rollouts" / "*.json"))):
        record = json.loads(Path(path).read_text())
        turn = record["trace"]["turns"][0]
        first[record["task_id"]] = (text_of(turn["prompt_token_ids"]), turn["completion_token_ids"])
    src, (src_text, _) = next(iter(first.items()))
    held_text = {t: src_text.replace(instr[src], instr[t]) for t in meta
                 if meta[t]["split"] == "heldout"}

    @torch.no_grad()
    def probe(kind: str, split: str) -> str:
        texts = held_text if split == "heldout" else {t: v[0] for t, v in first.items()}
        ok = formed = total = 0
        model.eval()
        for task, text in texts.items():
            prompt = variant(text, task, kind)
            ids = torch.tensor([prompt])
            outs = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                  temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=48,
                                  num_return_sequences=args.samples, pad_token_id=pad,
                                  eos_token_id=eos)
            for o in outs:
                total += 1
                m = re.search(r'"command": "(.*?)"\}\}\n</tool_call>',
                              tok.decode(o[len(prompt):], skip_special_tokens=False))
                formed += m is not None
                want = rf"echo {meta[task]['word']} > (/app/)?{re.escape(meta[task]['file'])}"
                ok += bool(m and re.fullmatch(want, m.group(1).strip()))
        model.train()
        return f"{split} {ok}/{total} ({ok / total:.0%}), well-formed {formed / total:.0%}"

    print(f"before SFT [{'full'}]: {probe('full', 'heldout')}; {probe('full', 'train')}")
    rng = random.Random(0)
    for kind, steps in (("short", args.short_steps), ("full", args.full_steps)):
        data = [(variant(text, t, kind), completion) for t, (text, completion) in first.items()]
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
        t0 = time.time()
        for step in range(1, steps + 1):
            batch = rng.sample(data, min(8, len(data)))
            width = max(len(p) + len(c) for p, c in batch)
            ids = torch.full((len(batch), width), pad)
            labels = torch.full((len(batch), width), -100)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for i, (p, c) in enumerate(batch):
                ids[i, :len(p) + len(c)] = torch.tensor(p + c)
                mask[i, :len(p) + len(c)] = 1
                labels[i, len(p):len(p) + len(c)] = torch.tensor(c)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % 100 == 0 or step == steps:
                print(f"{kind} step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s): "
                      f"{probe(kind, 'heldout')}; {probe(kind, 'train')}", flush=True)
    print(f"after SFT [full{', task last' if args.task_last else ''}]: "
          f"{probe('full', 'heldout')}; {probe('full', 'train')}")
    if args.save:
        import shutil

        model.save_pretrained(args.save)
        tok.save_pretrained(args.save)
        for name in ("chat_template.jinja", "generation_config.json"):
            if (base / name).exists():
                shutil.copy(base / name, args.save / name)
        print(f"saved the SFT model to {args.save}")


if __name__ == "__main__":
    main()
