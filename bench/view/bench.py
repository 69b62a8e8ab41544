"""How fast the run viewer opens a big run: 10,000 rollouts, generated, opened in a real browser.

    .venv/bin/python bench/view/bench.py [--rollouts 10000] [--keep DIR]

Generates a run directory in the shape harness.train writes (settings.json, rollouts.jsonl,
rollouts/NNNNN-task.json with a TrainingTrace of 3-6 engine turns each, trainer/metrics.jsonl,
trainer/groups.jsonl, summary.json), starts the viewer on it and prints:

    index_s        RunData.rollouts() + run() on a cold RunData (what the first request pays)
    api_run_s      GET /api/run over HTTP, cold server
    api_rollouts_s GET /api/rollouts over HTTP
    page_run_s     headless Chromium: navigate to the run view until it says ready (plots drawn)
    page_table_s   the same for the rollouts table (10,000 rows sorted, the first 500 shown)
    page_rollout_s one rollout's page (its trace read, tokens decoded)

The criterion (issue 19): a run directory of 10,000 rollouts opens in under 2 s. The index never
opens a rollout file, so the rollout files' size does not matter to the first three numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from harness.view.data import RunData  # noqa: E402
from harness.view.server import ViewServer  # noqa: E402

CAUSES = ["ok"] * 5 + ["model_failure"] * 8 + ["timeout", "infra_failure", "verifier_failure"]


def _turn(rng: random.Random, node: int, parent: int | None, prompt_len: int, aux: bool) -> dict:
    n = rng.randint(8, 60)
    prompt = [rng.randrange(4000) for _ in range(prompt_len)]
    completion = [rng.randrange(4000) for _ in range(n)]
    mask = [0] * prompt_len + ([0] * n if aux else [1] * n)
    return {
        "node_id": f"n{node}", "prompt_token_ids": prompt, "completion_token_ids": completion,
        "per_token_logps": [-rng.expovariate(2.0) for _ in range(n)], "loss_mask": mask,
        "request": {"new_messages": [{"role": "user", "content": f"step {node}: run the tests"}],
                    "n_messages": node + 1},
        "response": {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "",
            "tool_calls": [{"id": f"call_{node}", "type": "function", "function": {
                "name": "bash", "arguments": json.dumps({"command": "pytest -q"})}}]}}]},
        "metadata": {"dialect": "chat", "aux": aux, "aux_reason": "title" if aux else None,
                     "parent_id": None if parent is None else f"n{parent}",
                     "weight_version_start": 0, "weight_version_end": 0, "latency_s": 0.1,
                     "n_new_prompt_tokens": 20 if parent is not None else prompt_len},
    }


def generate(run_dir: Path, n_rollouts: int, *, num_generations: int = 8, seed: int = 0,
             traces: bool = True) -> None:
    """A run directory of `n_rollouts` rollouts in harness.train's layout (random content);
    `traces=False` writes the index and the trainer's lines but no rollout files."""
    rng = random.Random(seed)
    (run_dir / "rollouts").mkdir(parents=True, exist_ok=True)
    (run_dir / "trainer").mkdir(exist_ok=True)
    tasks = [f"task-{i:03d}" for i in range(40)]
    (run_dir / "settings.json").write_text(json.dumps({
        "harness": "mini-swe-agent", "model": None, "seed": seed, "steps": n_rollouts // 8,
        "num_generations": num_generations, "groups_per_step": 1, "output_dir": str(run_dir)}))
    t0 = time.time() - 3600
    groups: dict[int, list[dict]] = {}
    with (run_dir / "rollouts.jsonl").open("w") as index:
        for i in range(n_rollouts):
            g = i // num_generations
            task = tasks[g % len(tasks)]
            cause = rng.choice(CAUSES)
            env = None if cause in ("infra_failure", "verifier_failure") else \
                float(cause == "ok")
            episode = f"g{g}-r{i % num_generations}-{i:08x}"
            record = {"index": i, "task_id": task, "seed": g, "episode_id": episode,
                      "cause": cause, "env_reward": env,
                      "rewards": {} if env is None else {"reward": env},
                      "error": None if env is not None else f"{cause}: generated",
                      "attempts": 1, "timings": {"sandbox_start": 0.4, "agent_run": 12.0,
                                                 "verify": 0.8, "total": 14.0}}
            path = run_dir / "rollouts" / f"{i:05d}-{task}.json"
            if traces:
                turns, prompt_len = [], 300
                for k in range(rng.randint(3, 6)):
                    parent = None if k == 0 else (k - 2 if k == 3 and rng.random() < 0.3
                                                  else k - 1)
                    turns.append(_turn(rng, k, parent, prompt_len, aux=(k == 0)))
                    prompt_len += 80
                path.write_text(json.dumps({**record, "outcome": None,
                                            "trace": {"schema_version": 1, "turns": turns}}))
            index.write(json.dumps({**record, "finished_at": t0 + i * 0.35,
                                    "file": path.name}) + "\n")
            groups.setdefault(g, []).append({"episode_id": episode, "reward": env,
                                             "parts": {"env_reward": env}})
    with (run_dir / "trainer" / "groups.jsonl").open("w") as f, \
            (run_dir / "trainer" / "metrics.jsonl").open("w") as m:
        for g, rollouts in sorted(groups.items()):
            scored = [r["reward"] for r in rollouts if r["reward"] is not None]
            mean = sum(scored) / len(scored) if scored else 0.0
            skipped = None if len(set(scored)) > 1 else "zero_variance" if scored else "no_scored"
            for r in rollouts:
                r["advantage"] = None if skipped or r["reward"] is None else r["reward"] - mean
            f.write(json.dumps({"step": g + 1, "group_index": g, "skipped": skipped,
                                "rollouts": rollouts}) + "\n")
            m.write(json.dumps({"step": g + 1, "time": t0 + g, "reward/mean": mean,
                                "staleness/mean": rng.random(), "staleness/max": 1.0,
                                "tokens/trained": float(rng.randint(500, 3000)),
                                "time/forward_backward_s": 0.2, "time/optimizer_s": 0.05,
                                "time/weight_sync_s": 0.3, "time/step_s": 0.6,
                                f"groups/skipped/{skipped}": 1.0 if skipped else None}) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"rollouts": n_rollouts}))


def _get(url: str) -> float:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        r.read()
    return time.perf_counter() - t0


async def _pages(url: str) -> dict[str, float]:
    from harness.view.browser import Browser

    async with Browser() as browser:
        page = await browser.new_page()
        return {"page_run_s": await page.goto(url + "#/run"),
                "page_table_s": await page.goto(url + "#/rollouts"),
                "page_rollout_s": await page.goto(url + "#/rollout/9999")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=10_000)
    parser.add_argument("--keep", type=Path, default=None, help="generate here and keep it")
    parser.add_argument("--no-browser", action="store_true")
    args = parser.parse_args()
    run_dir = args.keep or Path(tempfile.mkdtemp(prefix="view-bench-"))
    try:
        t0 = time.perf_counter()
        if not (run_dir / "rollouts.jsonl").exists():
            generate(run_dir, args.rollouts)
        print(f"generated {args.rollouts} rollouts in {time.perf_counter() - t0:.1f} s: {run_dir}")
        t0 = time.perf_counter()
        data = RunData(run_dir)
        n = len(data.rollouts())
        data.run()
        figures = {"index_s": time.perf_counter() - t0}
        assert n == args.rollouts, f"index has {n} rows, expected {args.rollouts}"
        with ViewServer(RunData(run_dir), port=0) as server:
            figures["api_run_s"] = _get(server.url + "api/run")
            figures["api_rollouts_s"] = _get(server.url + "api/rollouts")
            if not args.no_browser:
                figures.update(asyncio.run(_pages(server.url)))
        for name, seconds in figures.items():
            print(f"{name:16s} {seconds:6.3f} s")
        worst = max(v for k, v in figures.items() if k != "page_rollout_s")
        print(f"opens in {worst:.2f} s (criterion < 2 s): {'PASS' if worst < 2 else 'FAIL'}")
        return 0 if worst < 2 else 1
    finally:
        if args.keep is None:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
