"""The trainer side imports nothing from openenv or harbor, so it can live with vLLM.

And the real `python -m harness.train` keeps it that way: its process (the trainer, the client of
the local rollout service it starts) never imports openenv, harbor or capture, while the run
still does everything (rollouts recorded, eval before/after, weight versions at the proxy).

vLLM's NCCL weight sync runs vLLM's trainer-side engine inside the trainer process, and vllm 0.32
cannot share an environment with openenv 0.10 (mcp pins). So: no module of trainer/ imports
openenv, harbor, harness or capture, not even lazily (checked on the source); importing all of
it in the project venv, which has openenv and harbor, pulls neither in; and in the ENGINE venv
(vLLM, no openenv, no harbor) the trainer, its weight-sync modules and vLLM's weight-transfer
modules import together and the trainer takes a step.

Run: .venv/bin/python -m pytest tests/test_trainer_isolation.py -q   (the real run: ~3 min here)
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.shared.errors import CAUSES, TRAINABLE_CAUSES
from launchers.paths import REPO_ROOT, SetupMissingError, engine_python

FORBIDDEN = ("openenv", "harbor", "harness", "capture")
TRAINER_MODULES = sorted(
    ".".join(p.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
    for p in (REPO_ROOT / "trainer").rglob("*.py")
    # the vLLM plugin's engine side imports vLLM at module level: it only loads inside vLLM
    if p.name != "gloo_engine.py"
)

IMPORT_ALL = """
import json, sys
for name in sys.argv[1].split(","):
    __import__(name)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
"""

ENGINE_VENV = """
import json, random, sys, tempfile
for name in sys.argv[1].split(","):
    __import__(name)
# vLLM's trainer-side NCCL engine, as trainer/weight_sync/nccl.py reaches it
from trainer.weight_sync.nccl import _import_vllm_nccl
_import_vllm_nccl()
import vllm.distributed.weight_transfer.nccl_engine, vllm.distributed.weight_transfer.packed_tensor
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM
from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, synthetic_trace
from trainer.grpo import HarnessAsyncGRPOTrainer

torch.manual_seed(0)
model = Qwen3ForCausalLM(Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=2,
                                     num_key_value_heads=1, head_dim=32))
source = ReplaySource(lambda s, k: synthetic_trace(random.Random(k), vocab=500),
                      lambda s, k: float(k % 2))
args = AsyncGRPOConfig(num_generations=2, max_steps=1, output_dir=tempfile.mkdtemp(),
                       report_to="none")
history = HarnessAsyncGRPOTrainer(model, lambda sampling: source, args).train()
print(json.dumps({"modules": sorted({m.split(".")[0] for m in sys.modules}),
                  "version": history[-1]["version"]}))
"""


def _imports_of(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):  # every import, also those inside functions (lazy ones)
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_trainer_module_imports_openenv_harbor_harness_or_capture_even_lazily():
    offenders = {
        str(p.relative_to(REPO_ROOT)): sorted(_imports_of(p) & set(FORBIDDEN))
        for p in (REPO_ROOT / "trainer").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_importing_all_of_trainer_in_the_project_venv_pulls_in_neither_openenv_nor_harbor():
    # This venv HAS openenv and harbor: a transitive import (a dependency's) would show here.
    out = subprocess.run([sys.executable, "-c", IMPORT_ALL, ",".join(TRAINER_MODULES)],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(json.loads(out.stdout.splitlines()[-1]))
    assert "torch" in loaded and "trainer" in loaded
    assert loaded.isdisjoint(FORBIDDEN)


def test_the_trainer_and_vllms_weight_transfer_import_together_in_the_engine_venv_and_step():
    try:
        python = engine_python()
    except SetupMissingError as exc:
        pytest.skip(f"no engine venv (the one with vLLM): {exc}")
    out = subprocess.run([str(python), "-c", ENGINE_VENV, ",".join(TRAINER_MODULES)],
                         capture_output=True, text=True, timeout=400,
                         env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert "vllm" in result["modules"] and "trainer" in result["modules"]
    assert set(result["modules"]).isdisjoint(FORBIDDEN)
    assert result["version"] == 1.0  # one real update, in the environment vLLM lives in


# The real main, with an audit hook that sees every module this process loads (also one loaded
# and dropped again); sys.modules at the end is checked too.
RUN_MAIN = """
import json, sys
HEAVY = ("openenv", "harbor", "capture")
loaded = []
def hook(event, args):
    if event == "import" and str(args[0]).split(".")[0] in HEAVY:
        loaded.append(str(args[0]))
sys.addaudithook(hook)
from harness.train import main
rc = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"rc": rc, "loaded": sorted(set(loaded)),
               "modules": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)}, f)
sys.exit(rc)
"""

SMALL = ["--harness", "mini-swe-agent", "--steps", "1", "--num-generations", "2",
         "--max-concurrent-rollouts", "2", "--task-count", "1", "--max-tokens", "96",
         "--max-agent-steps", "3", "--agent-timeout-s", "120", "--shuffle-rewards",
         "--eval-tasks", "harness/tasks/bundled/hello-file", "--eval-rollouts-per-task", "1",
         "--groups-per-step", "1"]


@pytest.mark.engine
@pytest.mark.agents
@pytest.mark.slow
def test_the_real_train_command_never_imports_openenv_harbor_or_capture(tmp_path: Path):
    out, report = tmp_path / "run", tmp_path / "modules.json"
    run = subprocess.run([sys.executable, "-c", RUN_MAIN, str(report), *SMALL,
                          "--output-dir", str(out)], cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=1200, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    modules = json.loads(report.read_text())
    assert modules == {"rc": 0, "loaded": [], "modules": []}, modules

    # ...and the run did all it did in one process: the service it started ran the rollouts,
    # the engine it started served them, one step trained, checkpointed and reported.
    for title in ("Rollouts by cause", "Training steps", "Time per phase"):
        assert title in run.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1 and summary["rollouts"] >= 2
    assert summary["timings"]["engine_start_s"] > 0
    index = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    # the rollouts of the step's groups, and apart any of a group dispatched ahead (issue 32)
    assert summary["rollouts"] == 2 and len(index) == 2 + summary["rollouts_not_trained"]
    assert all((out / "rollouts" / r["file"]).exists() for r in index)
    assert all(r["cause"] in CAUSES for r in index)
    trained = [r for r in index if r["cause"] in TRAINABLE_CAUSES]
    assert trained, f"no trainable rollout: {[(r['cause'], r['error']) for r in index]}"
    full = json.loads((out / "rollouts" / trained[0]["file"]).read_text())
    assert full["trace"]["schema_version"] == 1 and full["trace"]["turns"]
    assert any((out / "trainer").glob("checkpoint-*")), "no checkpoint written"
    before_after = json.loads((out / "before_after.json").read_text())
    assert before_after["shuffled_rewards"] is True
    assert before_after["before"]["scored"] + before_after["before"]["unscored"] == 1
    assert before_after["after"]["scored"] + before_after["after"]["unscored"] == 1
    curve = json.loads((out / "reward_curve.json").read_text())
    assert curve["shuffled_rewards"] is True and len(curve["steps"]) == 1
    for chart in ("reward_curve.png", "before_after.png"):  # drawn beside their JSON
        assert (out / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
    assert "before/after chart" in run.stdout
    assert (out / "capture").is_dir()  # the service's proxy logs beside the run, as before
    # The weight version the engine confirmed reached the service's proxy: the "after" rollouts'
    # engine calls are stamped with the trainer's last version.
    metrics = [json.loads(line) for line in
               (out / "trainer" / "metrics.jsonl").read_text().splitlines()]
    last_version = int(metrics[-1]["version"])
    after = [json.loads(f.read_text()) for f in (out / "eval-after" / "rollouts").glob("*.json")]
    stamps = {t["metadata"]["weight_version_start"]
              for r in after if r["trace"] for t in r["trace"]["turns"]}
    assert stamps == {last_version}, (stamps, last_version)
    # ...and before_after.json names them per rollout and checked them (issue 32).
    assert before_after["weight_check"] == {"before_expected": 0, "after_expected": last_version,
                                            "problems": []}
    assert [r["weight_versions"] for r in before_after["weight_versions"]["after"]
            if r["weight_versions"]] == [[last_version]]
    assert all(r["weight_versions"] in ([], [0]) for r in before_after["weight_versions"]["before"])
    assert "service_wait_s" in summary["timings"]
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps, "a process the run started (engine or service) is still alive"
