"""Prefix-shared forward against dense packing (issue 30), in one run: tokens forwarded and step time.

    .venv/bin/python bench/trainer/bench_prefix.py [--budget 8192] [--quick] [--turns 8]

Two steps, each trained once with `prefix_sharing=False` (dense: every row forwarded whole) and
once with `prefix_sharing=True` (trainer/prefix_tree.py), through the trainer's own `run_step`
(staleness, packing, forward, loss, backward, optimizer):

1. Claude Code shape: 32 rollouts (4 groups of 8), one turn each: the same 21,000-token prompt
   (system prompt + tool definitions), then ~100 sampled tokens. Goal: forwarded tokens within
   1.05x of the unique tokens, and the step >= 10x faster than dense.
2. Multi-turn branching: 16 rollouts (2 groups of 8), 6 turns each (100 sampled + 200 tool-result
   tokens a turn) after a 3,000-token system prompt and a 300-token task prompt, with the history
   rewritten (compacted) before turn 4: two rows per rollout, sharing the system and task prompt
   with each other and with the other rollouts. Goal: forwarded within 1.05x of unique.
3. A thinking model whose template strips reasoning (issue 34): 16 rollouts (2 groups of 8),
   `--turns` calls each (default 8), every observation a user turn (mini-swe-agent's habit), so
   Qwen3's template drops each earlier call's think block (200 tokens) and keeps its answer (50)
   and the observation (150): every call is a rewritten history and a row of its own, T rows a
   rollout, dense rows O(T^2) tokens. Goal: forwarded within 1.2x of unique. Measured (exact
   token counts, 2026-12-03): T=8/16/32 dense 9.38x/11.18x/14.75x of unique; shared 1.03x/1.21x/
   1.61x at the default budget 8,192, 1.03x/1.05x/1.06x at 32,768 (a rollout longer than the
   budget is split and its prefix forwarded again per part).

The model is a narrow Qwen3 (2 layers, hidden 64, 2 heads of 32 (no GQA: transformers' sdpa passes
`enable_gqa`, which on CPU takes the slow math kernel), vocabulary 4096, random weights): the point is the ratio between the two packings on the same model, and a
narrow model keeps the 675k-token dense step to a few minutes on a 2-core CPU. Attention is a
larger share of a narrow model's cost than of a real one's, so the time ratio here is not a GPU
forecast; the token ratio is exact. Tokens are random ids; only their sharing pattern matters.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from trainer.config import AsyncGRPOConfig  # noqa: E402
from trainer.fakes import ReplaySource, make_trace, make_turn  # noqa: E402
from trainer.grpo import HarnessAsyncGRPOTrainer  # noqa: E402
from trainer.loop import StepInput, run_step  # noqa: E402
from trainer.rows import Row, trace_to_rows  # noqa: E402

VOCAB = 4096


def _toks(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(10, VOCAB) for _ in range(n)]


def _logps(rng: random.Random, n: int) -> list[float]:
    return [-rng.uniform(0.05, 4.0) for _ in range(n)]


def claude_code_step(prefix: int = 21_000, unique: int = 100, groups: int = 4,
                     per_group: int = 8) -> tuple[list[Row], list[float]]:
    rng = random.Random(0)
    prompt = _toks(rng, prefix)
    rows, adv = [], []
    for g in range(groups):
        for k in range(per_group):
            comp = _toks(rng, unique)
            trace = make_trace(make_turn(prompt, comp, _logps(rng, unique), node_id="t0"))
            rs, _ = trace_to_rows(trace, rollout_id=f"g{g}r{k}", group_index=g)
            rows += rs
            adv += [rng.uniform(-1.5, 1.5)] * len(rs)
    return rows, adv


def branching_step(system: int = 3000, task: int = 300, groups: int = 2, per_group: int = 8,
                   turns: int = 6, completion: int = 100, tool: int = 200,
                   rewrite_at: int = 4) -> tuple[list[Row], list[float]]:
    rng = random.Random(1)
    sys_prompt = _toks(rng, system)
    rows, adv = [], []
    for g in range(groups):
        task_prompt = sys_prompt + _toks(rng, task)
        for k in range(per_group):
            held, out = list(task_prompt), []
            for t in range(turns):
                if t == rewrite_at:  # compaction: summary replaces the history
                    held = task_prompt + _toks(rng, 200)
                comp = _toks(rng, completion)
                out.append(make_turn(held, comp, _logps(rng, completion), node_id=f"t{t}"))
                held = held + comp + _toks(rng, tool)
            rs, _ = trace_to_rows(make_trace(*out), rollout_id=f"g{g}r{k}", group_index=g)
            rows += rs
            adv += [rng.uniform(-1.5, 1.5)] * len(rs)
    return rows, adv


def thinking_step(system: int = 3000, task: int = 300, groups: int = 2, per_group: int = 8,
                  turns: int = 8, think: int = 200, answer: int = 50, observation: int = 150
                  ) -> tuple[list[Row], list[float]]:
    rng = random.Random(2)
    sys_prompt = _toks(rng, system)
    rows, adv = [], []
    for g in range(groups):
        task_prompt = sys_prompt + _toks(rng, task)
        for k in range(per_group):
            history, out = list(task_prompt), []
            for t in range(turns):
                thought, said = _toks(rng, think), _toks(rng, answer)
                comp = thought + said
                out.append(make_turn(history, comp, _logps(rng, len(comp)), node_id=f"t{t}"))
                history = history + said + _toks(rng, observation)  # the thought is dropped
            rs, _ = trace_to_rows(make_trace(*out), rollout_id=f"g{g}r{k}", group_index=g)
            rows += rs
            adv += [rng.uniform(-1.5, 1.5)] * len(rs)
    return rows, adv


def narrow_model() -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=32, max_position_embeddings=32_768, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).float()


def one_step(rows: list[Row], adv: list[float], *, sharing: bool, budget: int) -> dict:
    args = AsyncGRPOConfig(num_generations=8, max_steps=1, learning_rate=1e-6,
                           max_tokens_per_microbatch=budget, prefix_sharing=sharing,
                           output_dir="/tmp/bench_prefix", report_to="none")
    source = ReplaySource(lambda s, k: None, lambda s, k: None)
    trainer = HarnessAsyncGRPOTrainer(narrow_model(), lambda sampling: source, args)
    t0 = time.perf_counter()
    m = run_step(trainer, StepInput(rows=rows, advantages=adv))
    m["wall_s"] = time.perf_counter() - t0
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=int, default=AsyncGRPOConfig.max_tokens_per_microbatch,
                    help="max_tokens_per_microbatch (default: the config's)")
    ap.add_argument("--quick", action="store_true", help="smaller shapes (a smoke run)")
    ap.add_argument("--dense-rows", type=int, default=4,
                    help="Claude Code shape: time the dense step on this many of its 32 rows and "
                         "scale to 32 (its rows are identical-length independent forwards; a "
                         "full dense run is ~30 CPU-minutes here); 0: run all")
    ap.add_argument("--turns", type=int, default=8,
                    help="thinking shape: calls per rollout, each a rewritten history")
    a = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    shapes = {
        "claude_code": claude_code_step(**({"prefix": 2100, "per_group": 2} if a.quick else {})),
        "branching": branching_step(**({"system": 600, "per_group": 2} if a.quick else {})),
        "thinking": thinking_step(turns=a.turns,
                                  **({"system": 600, "per_group": 2} if a.quick else {})),
    }
    one_step(*branching_step(system=50, task=10, per_group=2, turns=2), sharing=True,
             budget=a.budget)  # warm-up: allocator, kernels, lazy imports
    header = (f"{'step':<12} {'rows':>4} {'row tokens':>11} {'unique':>8} {'dense fwd':>10} "
              f"{'shared fwd':>10} {'fwd/unique':>10} {'mbs d/s':>8} {'dense s':>8} "
              f"{'shared s':>8} {'speed-up':>8} {'loss diff':>9}")
    lines = []
    for name, (rows, adv) in shapes.items():
        n = a.dense_rows if name == "claude_code" and 0 < a.dense_rows < len(rows) else len(rows)
        d = one_step(rows[:n], adv[:n], sharing=False, budget=a.budget)
        s = one_step(rows, adv, sharing=True, budget=a.budget)
        if n < len(rows):  # scale the sampled dense step to the whole step
            print(f"({name}: dense step timed on {n} of {len(rows)} identical-length rows: "
                  f"{d['time/step_s']:.2f} s, {int(d['packing/microbatches'])} micro-batches; "
                  f"scaled x{len(rows) / n:g})", flush=True)
            d["time/step_s"] *= len(rows) / n
            d["packing/microbatches"] *= len(rows) / n
            d["tokens/forwarded"] = s["packing/row_tokens"]  # dense forwards every row whole
        loss_diff = f"{abs(d['loss'] - s['loss']):.1e}" if n == len(rows) else "n/a"
        lines.append(
            f"{name:<12} {len(rows):>4} {int(s['packing/row_tokens']):>11,} "
            f"{int(s['packing/unique_tokens']):>8,} {int(d['tokens/forwarded']):>10,} "
            f"{int(s['tokens/forwarded']):>10,} {s['packing/forwarded_per_unique']:>9.3f}x "
            f"{int(d['packing/microbatches']):>3}/{int(s['packing/microbatches']):<4} "
            f"{d['time/step_s']:>8.2f} {s['time/step_s']:>8.2f} "
            f"{d['time/step_s'] / s['time/step_s']:>7.1f}x {loss_diff:>9}")
        print(lines[-1] if len(lines) > 1 else header + "\n" + lines[-1], flush=True)
    print(f"(budget {a.budget}, torch threads {torch.get_num_threads()}; step = run_step wall "
          "time incl. packing, forward, backward, optimizer)")


if __name__ == "__main__":
    main()
