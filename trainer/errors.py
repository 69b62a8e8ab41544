"""The trainer's exception tree. The class is the cause label the metrics count.

```
TrainerError                  anything the trainer raises on purpose
├── ConfigError               AsyncGRPOConfig.validate() found problems (all listed at once)
├── CaptureError              a TrainingTrace breaks the training contract (a FATAL finding):
│                             training on it is worse than stopping, so it stops the run
├── RolloutSourceError        the session factory does not speak either rollout protocol
└── CheckpointError           a checkpoint directory is missing, partial or from another run shape
```

Runtime failures of single rollouts (a sandbox that died, a verifier that raised, a reward
function that returned a string) are NOT exceptions here: they are counted by cause
(`rollouts/cause/<cause>`) and the rollout leaves its group's baseline. Only a capture that
lies about its tokens, or a programming error, stops training.
"""

from __future__ import annotations

__all__ = [
    "CaptureError",
    "CheckpointError",
    "ConfigError",
    "RolloutSourceError",
    "TrainerError",
]


class TrainerError(Exception):
    """Base class of every error the trainer raises deliberately."""


class ConfigError(TrainerError, ValueError):
    """One or more config fields are invalid; `problems` lists every one of them."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in AsyncGRPOConfig:\n{lines}")


class CaptureError(TrainerError):
    """A captured TrainingTrace is malformed (FATAL finding); `findings` carries the codes."""

    def __init__(self, message: str, findings: list | None = None):
        self.findings = list(findings or [])
        super().__init__(message)


class RolloutSourceError(TrainerError, TypeError):
    """The object made by `harness_session_factory` has neither `rollout()` nor `create()`."""


class CheckpointError(TrainerError):
    """A checkpoint cannot be loaded (missing files, or saved by a different run shape)."""
