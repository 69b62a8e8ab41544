"""trainer/: async GRPO on captured agent traces. Knows sessions only through RolloutSource.

Components (each importable and testable alone): config, rows, packing, staleness, advantages,
rewards, loss, rollouts (the session seam), producer, groups, loop (the step), checkpoint,
distributed, metrics; `grpo.HarnessAsyncGRPOTrainer` wires them. Weight sync into vLLM lives in
trainer/weight_sync/ and is reached only through the `WeightSync` protocol.

The names below are loaded lazily (PEP 562): vLLM imports `trainer.weight_sync.vllm_plugin` in
the engine venv, which runs this file first and has torch but not transformers or openenv.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "AsyncGRPOConfig",
    "CaptureError",
    "CheckpointError",
    "ConfigError",
    "HarnessAsyncGRPOTrainer",
    "RewardFunc",
    "Rollout",
    "RolloutOutcome",
    "RolloutSource",
    "RolloutSourceError",
    "TrainerError",
    "WeightSync",
]

_HOME = {
    "AsyncGRPOConfig": "trainer.config",
    "CaptureError": "trainer.errors",
    "CheckpointError": "trainer.errors",
    "ConfigError": "trainer.errors",
    "HarnessAsyncGRPOTrainer": "trainer.grpo",
    "RewardFunc": "trainer.rewards",
    "Rollout": "trainer.rollouts",
    "RolloutOutcome": "trainer.rollouts",
    "RolloutSource": "trainer.rollouts",
    "RolloutSourceError": "trainer.errors",
    "TrainerError": "trainer.errors",
    "WeightSync": "trainer.grpo",
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
