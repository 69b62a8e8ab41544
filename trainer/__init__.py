"""trainer/: async GRPO on captured agent traces. Knows sessions only through RolloutSource.

Components (each importable and testable alone): config, rows, packing, staleness, advantages,
rewards, loss, rollouts (the session seam), producer, groups, loop (the step), checkpoint,
distributed, metrics; `grpo.HarnessAsyncGRPOTrainer` wires them. Weight sync into vLLM lives in
trainer/weight_sync/ and is reached only through the `WeightSync` protocol.
"""

from trainer.config import AsyncGRPOConfig
from trainer.errors import (
    CaptureError,
    CheckpointError,
    ConfigError,
    RolloutSourceError,
    TrainerError,
)
from trainer.grpo import HarnessAsyncGRPOTrainer, WeightSync
from trainer.rewards import RewardFunc
from trainer.rollouts import Rollout, RolloutOutcome, RolloutSource

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
