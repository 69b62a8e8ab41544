"""Trainer side of the "harness_gloo" backend: host the gloo group, broadcast packed chunks.

The engine side is `trainer.weight_sync.gloo_engine` (inside vLLM's workers); the wire format is
`trainer.weight_sync.wire`. One push, as the engine sees it:

```
trainer rank 0                                  vLLM worker(s), ranks 1..N
POST /start_weight_update  ------------------>  drop stale buffers
POST /update_weights {names,dtypes,shapes} -->  plan chunks, block in broadcast #1
broadcast chunk 1..K (uint8 buffers)  ======>  receive into fresh buffers
                      <----------------------  200 when the last chunk has arrived
POST /finish_weight_update {weight_version} ->  layerwise reload: load, re-pack kernels
```

`/update_weights` returns only after every chunk has arrived, so the request and the broadcast
run on two daemon threads. If the request fails first (the worker rejected the metadata and will
never join the broadcast), the error is raised at once and the group abandoned: a gloo send whose
peer never comes cannot be cancelled from the sending side, so the blocked thread is left to end
at the group timeout while the caller resumes the engine and moves on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from typing import Any

import torch

from launchers.net import free_port
from trainer.weight_sync.client import EngineControlClient
from trainer.weight_sync.exit_guard import guarded
from trainer.weight_sync.source import NameMap, iter_full_parameters, parameter_metas
from trainer.weight_sync.wire import (
    DEFAULT_CHUNK_BYTES,
    GlooGroup,
    TensorMeta,
    open_gloo_group,
    pack_chunk,
    plan_chunks,
)

__all__ = ["GlooTransport"]

log = logging.getLogger(__name__)

_GRACE_S = 10.0


class GlooTransport:
    """Rank 0 of a gloo group with every vLLM worker. `connect` once, `send` per push."""

    backend = "harness_gloo"

    def __init__(
        self,
        *,
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout_s: float = 300.0,
        name_map: NameMap | None = None,
    ) -> None:
        self.name_map = name_map
        self.master_address = master_address
        self.master_port = master_port
        self.chunk_bytes = chunk_bytes
        self.timeout_s = timeout_s
        self.group: GlooGroup | None = None
        self.stage = "idle"  # the protocol step in progress, for error messages

    @property
    def connected(self) -> bool:
        return self.group is not None

    def connect(self, client: EngineControlClient, engine_world_size: int) -> None:
        """Open the group: the engine's workers join while this thread hosts the store."""
        port = self.master_port or free_port(self.master_address)
        init_info = {
            "master_address": self.master_address,
            "master_port": port,
            "world_size": 1 + engine_world_size,
            "rank_offset": 1,
            "chunk_bytes": self.chunk_bytes,
            "timeout_s": self.timeout_s,
        }
        # The workers block inside /init_weight_transfer_engine until the group is complete, and
        # so does open_gloo_group here: both must be in flight together. If the request fails
        # (engine not configured), the store thread is left to time out on its own (daemon).
        init = _spawn(client.init_weight_transfer_engine, init_info)
        opener = _spawn(
            open_gloo_group, self.master_address, port, 0, 1 + engine_world_size, self.timeout_s
        )
        self.group = _race(init, opener, on_first_failure=lambda: None, grace_s=0.0)
        log.info(
            "weight sync: gloo group open on %s:%d with %d vLLM worker(s)",
            self.master_address,
            port,
            engine_world_size,
        )

    def send(self, client: EngineControlClient, model: torch.nn.Module, weight_version: str) -> None:
        """start -> update (+ broadcast) -> finish. On failure `self.stage` names the step."""
        if self.group is None:
            raise RuntimeError("GlooTransport.send before connect")
        group = self.group
        metas = parameter_metas(model, self.name_map)
        update_info = {
            "names": [m.name for m in metas],
            "dtype_names": [m.dtype for m in metas],
            "shapes": [list(m.shape) for m in metas],
        }
        tensors = (tensor for _, tensor in iter_full_parameters(model, self.name_map))
        self.stage = "start_weight_update"
        client.start_weight_update()
        self.stage = "update_weights"
        request = _spawn(client.update_weights, update_info)
        broadcast = _spawn(self._broadcast, group, metas, tensors)
        _race(request, broadcast, on_first_failure=self._abandon)
        self.stage = "finish_weight_update"
        client.finish_weight_update(weight_version)
        self.stage = "done"

    def _broadcast(
        self, group: GlooGroup, metas: list[TensorMeta], tensors: Iterable[torch.Tensor]
    ) -> None:
        it = iter(tensors)
        with guarded():  # packing copies in torch's C++ too, on this daemon thread
            for chunk in plan_chunks(metas, self.chunk_bytes):
                chunk_metas = [metas[i] for i in chunk]
                group.broadcast(pack_chunk(chunk_metas, [next(it) for _ in chunk]))

    def _abandon(self) -> None:
        """Drop a group with a collective still in flight (see `_race`); never blocks."""
        group, self.group = self.group, None
        if group is not None:
            group.abandon()

    def close(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()


def _spawn(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run `fn` on a daemon thread. Daemon, not a pool: a side blocked in a collective whose peer
    is gone must not keep the interpreter from exiting until the gloo timeout."""
    future: Future[Any] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn(*args))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name=f"weight-sync-{fn.__name__}", daemon=True).start()
    return future


def _race(
    request: Future[Any],
    local: Future[Any],
    *,
    on_first_failure: Callable[[], None],
    grace_s: float = _GRACE_S,
) -> Any:
    """Wait for both; if either fails, call `on_first_failure` (to unblock the other) and raise.

    Returns the local future's result. The request's error wins when both fail, because it
    carries the engine's explanation (the local side then only says "connection closed"). A side
    still blocked after a failure is abandoned on its daemon thread: a gloo send whose peer never
    joins cannot be cancelled from this side (neither `abort()` nor `shutdown()` unblocks it,
    measured with torch 2.14; shutdown even waits for it), so it ends at the group timeout.
    """
    wait([request, local], return_when=FIRST_EXCEPTION)
    if request.done() and request.exception() is not None:
        on_first_failure()
        raise request.exception()  # type: ignore[misc]
    if local.done() and local.exception() is not None:
        on_first_failure()
        # The engine usually fails right after (its side of the group broke too) and says more.
        wait([request], timeout=grace_s)
        if request.done() and request.exception() is not None:
            raise request.exception()  # type: ignore[misc]
        raise local.exception()  # type: ignore[misc]
    return local.result()
