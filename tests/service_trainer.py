"""A trainer process that gets its rollouts from rollout services (tests/test_service_train_e2e.py).

    python tests/service_trainer.py ENGINE_URL OUT_DIR URL [URL ...]   ($HARNESS_SERVICE_KEY)

What it holds: the trainer (torch, transformers), the CPU weight sync into the engine, and the
client (`harness.client.remote`); never openenv or harbor, which it checks and reports at the end in
OUT_DIR/trainer_process.json with the run's summary. Every rollout is recorded under OUT_DIR as
`python -m harness.train` does (harness.shared.run_records).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

from harness.client.remote import RemoteSessionFactory, ServicePool
from harness.shared.run_config import RunSettings
from harness.shared.run_records import RecordingFactory
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.weight_sync import VLLMWeightSync

_calls = itertools.count()


def alternating_reward(outcome: object) -> float:
    """0, 1, 0, 1, ...: every group with two scored rollouts has variance and trains, whatever
    the tiny model samples (the subject here is the plumbing, not learning)."""
    return float(next(_calls) % 2)


def main(engine_url: str, out: Path, urls: list[str]) -> None:
    from launchers.tiny_model import build_tiny_model

    settings = RunSettings(engine_url=engine_url, steps=3, num_generations=2, groups_per_step=1,
                           tasks="bundled",
                           max_concurrent_rollouts=2, max_tokens=96, max_agent_steps=3,
                           agent_timeout_s=120, output_dir=str(out))
    pool = ServicePool(urls)
    made: list[RecordingFactory] = []

    def factory(sampling: dict) -> RecordingFactory:
        remote = RemoteSessionFactory(
            urls, pool=pool, harness="mini-swe-agent", sampling=sampling,
            max_tokens=settings.max_tokens, max_steps=settings.max_agent_steps,
            agent_timeout_s=settings.agent_timeout_s, max_attempts=2, backoff_s=0.5,
            max_concurrent_rollouts=settings.max_concurrent_rollouts)
        made.append(RecordingFactory(remote, out))
        return made[-1]

    sync = VLLMWeightSync(engine_url, "harness_gloo", on_version=pool.set_weight_version)
    t0 = time.perf_counter()
    trainer = HarnessAsyncGRPOTrainer(model=str(build_tiny_model()), harness_session_factory=factory,
                                      args=settings.trainer_config(), rollout_reward_fn=alternating_reward,
                                      weight_sync=sync)
    try:
        history = trainer.train()
    finally:
        sync.close()
        pool.close()
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"openenv", "harbor"})
    records = [r for f in made for r in f.records]
    report = {
        "steps": len(history), "rollouts": len(records), "imported": heavy,
        "causes": [r["cause"] for r in records], "errors": [r["error"] for r in records],
        "counts": {k: v for f in made for k, v in f.factory.metrics.items()},
        "services": pool.metrics(), "training_s": time.perf_counter() - t0,
        "versions": [m.get("version") for m in history],
    }
    (out / "trainer_process.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
