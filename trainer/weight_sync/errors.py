"""Weight-sync errors. The class is the cause; the message names the fix.

```
WeightSyncError                     anything that stops weights reaching the engine
├── WeightSyncSetupError            the engine or trainer is not set up for weight transfer
│                                   (dev mode off, no --weight-transfer-config, plugin missing,
│                                   backend mismatch, engine unreachable, vllm not importable for
│                                   NCCL); raised before the engine is paused, nothing changed
└── WeightSyncPushError             one push failed after it started; `.stage` says where,
                                    `.engine_resumed` whether the engine was resumed afterwards,
                                    `.weights_intact` whether the engine still serves the previous
                                    version (False only when applying on the engine side failed)
```
"""

from __future__ import annotations

__all__ = ["WeightSyncError", "WeightSyncPushError", "WeightSyncSetupError"]


class WeightSyncError(RuntimeError):
    """Weights did not reach the engine."""


class WeightSyncSetupError(WeightSyncError):
    """The engine (or this trainer) is not set up for weight transfer; the message says how."""


class WeightSyncPushError(WeightSyncError):
    """A push failed part-way. The transfer group is torn down; the next push opens a new one."""

    def __init__(
        self, message: str, *, stage: str, engine_resumed: bool, weights_intact: bool
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.engine_resumed = engine_resumed
        self.weights_intact = weights_intact
