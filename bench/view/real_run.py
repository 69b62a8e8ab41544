"""The real runs behind docs/view-*.png: train then eval, every part real but the engine.

    PYTHONPATH=. .venv/bin/python bench/view/real_run.py OUT [--harness mini-swe-agent] [--steps 3]
    PYTHONPATH=. .venv/bin/python -m harness.view OUT/train --compare OUT/eval --screenshots docs

`harness.train` (4 groups, the default, of --num-generations rollouts per step) and
`harness.eval` (2 rollouts) of the bundled hello-file task, through the capture proxy, bubblewrap
sandboxes, the real agent CLI, the task's verifier and the trainer. The engine is
harness/audit/scripted_engine.py playing the browser test's GreetingPolicy (tests/helpers/policies.py): in
training, one rollout of each pair solves the task and the other only talks, so every group has
an advantage to show; in eval all solve.
The model is the tiny model without its warm-up (built in ~10 s; its samples are not used).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console  # noqa: E402

from harness.audit.scripted_engine import ScriptedEngine  # noqa: E402
from harness.eval import run_eval  # noqa: E402
from harness.shared.run_config import RunSettings  # noqa: E402
from harness.train import run_training  # noqa: E402
from launchers.tiny_model import build_tiny_model  # noqa: E402
from tests.helpers.policies import TASK_DIR, GreetingPolicy  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="writes OUT/train and OUT/eval (replaced)")
    parser.add_argument("--harness", default="mini-swe-agent")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--num-generations", type=int, default=2)
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    model = build_tiny_model(seed=0, root=args.out / "model", warmup_steps=0)
    tasks = args.out / "tasks"
    shutil.copytree(TASK_DIR, tasks / "hello-file")
    common = {"harness": args.harness, "model": str(model), "tasks": str(tasks), "max_tokens": 256,
              "max_agent_steps": 3, "agent_timeout_s": 180.0, "max_concurrent_rollouts": 2}
    t0 = time.perf_counter()
    with ScriptedEngine(model, GreetingPolicy(talkers=True)) as engine:
        run_training(RunSettings(**common, engine_url=engine.url, weight_sync=False,
                                 steps=args.steps, num_generations=args.num_generations,
                                 output_dir=str(args.out / "train")), Console(width=160))
        engine.script = GreetingPolicy(talkers=False)
        run_eval(RunSettings(**common, engine_url=engine.url, rollouts_per_task=2,
                             output_dir=str(args.out / "eval")), Console(width=160))
    print(f"train + eval in {time.perf_counter() - t0:.0f} s: {args.out}/train, {args.out}/eval")
    return 0


if __name__ == "__main__":
    sys.exit(main())
