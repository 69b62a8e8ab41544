"""Push the trainer's weights into several vLLM engines, and say the version only once all have it.

With `--engine-url a,b,...` one capture proxy spreads rollout sessions over several engines
(capture/engines.py), each serving the same weights. The trainer pushes each version into every
engine (one `VLLMWeightSync` each, its own transfer group), and the proxy is told the version only
after every live engine confirmed it:

```
push(v):  engine a: pause -> start -> update -> finish(v) -> resume  \\   all pushes at once,
          engine b: pause -> start -> update -> finish(v) -> resume  /   one thread each
          ... every one returned ...  ->  on_version(v, retired=[...])   the proxy stamps v
```

So no call is recorded at version v from an engine still at v-1. The stamp errs the other way
only: a call that starts on an engine already at v before the last engine finished is recorded
at v-1 (with one engine the same happens between its /resume and the stamp); the pushes run in
parallel to keep that window as short as the slowest push.

WHEN ONE ENGINE'S PUSH FAILS (any `WeightSyncError`: a step of the protocol failed, or the
engine is gone and refuses the connection): that engine is retired. It is never pushed to again,
its transfer group is closed, and `on_version(v, retired=[its URL])` tells the proxy to take it out
*before* stamping v (the proxy cuts its in-flight calls, which become infra failures: they were
sampled from the older weights, and the stamp would have called them v). The other engines serve
v and the run goes on with one engine fewer, logged as a warning. If the push fails on every
engine still live, nothing is stamped and the error says "no engine left" with each engine's
own message (which names the fix: a flag, an address, a restart); the run stops. It is a
`WeightSyncSetupError` when every engine's was one (a misconfiguration shared by all), else a
`WeightSyncPushError`. Anything else (a bug, not an engine's failure) is raised as it is.

What it does not do: run under a multi-process trainer. Each engine reads the model once per
push, and under FSDP2 each read is a gather that every rank must join, while the other ranks
drain one read per push (trainer/loop.py `push_weights`); the constructor refuses it rather than
deadlock. A gather read once and sent to every engine is the way to lift that.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch.distributed as dist

from trainer.weight_sync.errors import (
    WeightSyncError,
    WeightSyncPushError,
    WeightSyncSetupError,
)
from trainer.weight_sync.source import FullModelView
from trainer.weight_sync.sync import VLLMWeightSync

__all__ = ["FanOutWeightSync"]

log = logging.getLogger(__name__)

# called as on_version(version, retired=[engine URL, ...]): a keyword, because the proxies'
# set_weight_version takes (version, model=None, *, retired=None)
OnVersion = Callable[..., Any]


class FanOutWeightSync:
    """`WeightSync` into several engines (module docstring).

    Args:
        syncs: one `VLLMWeightSync` per engine, each without an `on_version` of its own.
        on_version: called as `on_version(version, retired=[...])` once every live engine
            serves `version`; `retired` lists the engines whose push of it failed (e.g. the
            ServicePool's or a CaptureClient's `set_weight_version`).
    """

    def __init__(self, syncs: list[VLLMWeightSync], *, on_version: OnVersion | None = None
                 ) -> None:
        if not syncs:
            raise ValueError("FanOutWeightSync needs at least one engine's VLLMWeightSync")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise WeightSyncSetupError(
                "several engines with a multi-process trainer: each engine would read the model "
                "once per push, a gather every rank must join; run one engine per trainer, or a "
                "single-process trainer (trainer/weight_sync/fanout.py says why)")
        for sync in syncs:
            if sync.on_version is not None:
                raise ValueError(f"the sync into {sync.engine_url} has an on_version of its own: "
                                 "give it to FanOutWeightSync, which calls it once all have it")
        self.syncs = list(syncs)
        self.live = list(syncs)
        self.retired: dict[str, str] = {}  # engine URL -> why its push failed
        self.on_version = on_version
        self.version: int | None = None  # the last version every live engine confirmed

    @property
    def engine_urls(self) -> list[str]:
        return [s.engine_url for s in self.live]

    def push(self, model: Any, version: int) -> None:
        """Make every live engine serve `model`'s weights as `version`, then tell `on_version`."""
        views = [model] + [_another_view(model) for _ in self.live[1:]]
        with ThreadPoolExecutor(len(self.live), thread_name_prefix="weight-push") as pool:
            futures = [pool.submit(s.push, v, version) for s, v in zip(self.live, views,
                                                                       strict=True)]
            errors = [f.exception() for f in futures]  # waits for every push
        for error in errors:
            if error is not None and not isinstance(error, WeightSyncError):
                raise error
        failed = [(s, e) for s, e in zip(self.live, errors, strict=True) if e is not None]
        if len(failed) == len(self.live):
            message = (f"weight sync of version {version}: no engine left, the push failed on "
                       "every one: " + "; ".join(f"{s.engine_url}: {e}" for s, e in failed))
            if all(isinstance(e, WeightSyncSetupError) for _, e in failed):
                raise WeightSyncSetupError(message)
            pushes = [e for _, e in failed if isinstance(e, WeightSyncPushError)]
            if not pushes:  # plain WeightSyncErrors (and setup ones): nothing says more
                raise WeightSyncError(message)
            raise WeightSyncPushError(
                message, stage=pushes[0].stage,
                engine_resumed=all(e.engine_resumed for e in pushes),
                weights_intact=all(e.weights_intact for e in pushes))
        for sync, error in failed:
            self._retire(sync, version, error)
        self.version = version
        if self.on_version is not None:
            self.on_version(version, retired=[s.engine_url for s, _ in failed])

    def _retire(self, sync: VLLMWeightSync, version: int, error: BaseException) -> None:
        self.live.remove(sync)
        self.retired[sync.engine_url] = str(error)
        log.warning("weight sync of version %d into %s failed; that engine is retired (the "
                    "proxy takes it out before stamping the version), %d engine(s) left: %s",
                    version, sync.engine_url, len(self.live), error)
        sync.close()

    def close(self) -> None:
        for sync in self.live:
            sync.close()

    def __enter__(self) -> FanOutWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _another_view(model: Any) -> Any:
    """The model for one more engine: a `FullModelView` is read once per push, so each engine
    gets a fresh one over the same module; a plain module can be read any number of times."""
    if isinstance(model, FullModelView):
        return FullModelView(model.model, model.dtype)
    return model
