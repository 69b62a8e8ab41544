"""Metrics: one writer, several sinks, and a null sink so the loop never asks "is logging on?".

    writer = MetricsWriter.create(config, enabled=is_rank_zero)
    writer.log(step, {"loss": ..., "reward/mean": ...})   # every sink gets every record
    writer.close()

Sinks: console (a rich progress bar with the headline numbers; always on rank 0), JSONL
(`<output_dir>/metrics.jsonl`, one object per step, for report_to="jsonl" and also under
trackio/wandb so a run always leaves a local record), trackio, W&B. Ranks other than 0 get a
writer with no sinks (nanochat's DummyWandb idea). trackio and wandb are imported only when
asked for; a missing package is a clear error at start-up, not a crash at step 1.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Protocol

__all__ = ["HEADLINE", "ConsoleSink", "JsonlSink", "MetricsSink", "MetricsWriter", "headline"]

# The progress line's numbers, each under a key that says what it is and appears once: the last
# path part alone made "reward/mean" and "staleness/mean" both "mean=" (issue 32).
HEADLINE = {"loss": "loss", "reward/mean": "reward_mean", "grad_norm": "grad_norm",
            "policy/ratio_mean": "ratio_mean", "staleness/mean": "staleness_mean"}


def headline(metrics: dict[str, float]) -> str:
    """The progress line's description: `loss=0.12 reward_mean=0.5 ...` for the keys present."""
    return " ".join(f"{label}={metrics[key]:.4g}" for key, label in HEADLINE.items()
                    if key in metrics)


class MetricsSink(Protocol):
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._f = path.open("a", encoding="utf-8")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: (v if isinstance(v, (int, float)) and math.isfinite(v) else None)
                 for k, v in metrics.items()}
        self._f.write(json.dumps({"step": step, "time": time.time(), **clean}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class ConsoleSink:
    """A rich progress bar whose description carries the headline numbers of the last step."""

    def __init__(self, total_steps: int, start_step: int = 0):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]grpo"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"),
        )
        self._task = self._progress.add_task("", total=total_steps, completed=start_step)
        self._progress.start()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._progress.update(self._task, completed=step, description=headline(metrics))

    def close(self) -> None:
        self._progress.stop()


class _TrackingSink:
    """trackio and wandb share the `init / log(dict, step=) / finish` shape."""

    def __init__(self, module_name: str, project: str, run_name: str | None, config: dict):
        try:
            self._mod = __import__(module_name)
        except ImportError as exc:
            raise ImportError(f"report_to={module_name!r} but {module_name} is not installed: "
                              f"pip install {module_name}, or set report_to='jsonl'") from exc
        self._mod.init(project=project, name=run_name, config=config)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._mod.log(metrics, step=step)

    def close(self) -> None:
        self._mod.finish()


class MetricsWriter:
    """Sends every `every`-th step's metrics to the sinks (`logging_steps`), and the last step
    logged at `close()` if it fell between (so a run's final numbers always land)."""

    def __init__(self, sinks: list[Any], every: int = 1):
        self.sinks = sinks
        self.every = max(int(every), 1)
        self._pending: tuple[int, dict[str, float]] | None = None

    @classmethod
    def create(cls, config: Any, *, enabled: bool, start_step: int = 0,
               console: bool = True) -> MetricsWriter:
        every = getattr(config, "logging_steps", 1)
        if not enabled:
            return cls([], every)
        sinks: list[Any] = []
        if console:
            sinks.append(ConsoleSink(config.max_steps, start_step))
        if config.report_to != "none":
            sinks.append(JsonlSink(Path(config.output_dir) / "metrics.jsonl"))
        if config.report_to in ("trackio", "wandb"):
            sinks.append(_TrackingSink(config.report_to, config.project, config.run_name,
                                       config.to_dict()))
        return cls(sinks, every)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every:
            self._pending = (step, metrics)
            return
        self._pending = None
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        if self._pending is not None:
            step, metrics = self._pending
            self._pending = None
            for sink in self.sinks:
                sink.log(step, metrics)
        for sink in self.sinks:
            sink.close()
        self.sinks = []
