"""Push the trainer's weights into a running vLLM engine, over vLLM's weight-transfer protocol.

One push, from trainer rank 0 (the only rank that talks to vLLM):

```
pause(mode=keep) -> start_weight_update -> update_weights + stream tensors -> finish(version)
      -> resume -> on_version(version)          (the capture proxy's set_weight_version)
```

The transfer group is opened once, lazily, at the first push (`/init_weight_transfer_engine`
with the trainer as rank 0 and every vLLM worker after it) and reopened after a failed push.

How the group is sized (read from vLLM 0.32's weight-transfer code,
vllm/distributed/weight_transfer/nccl_common.py and vllm/entrypoints/rl/online/api_router.py):
the trainer asks GET /get_world_size, which answers the engine's whole world with data
parallelism counted (`parallel_config.world_size_across_dp` = TP x PCP x PP x DP), and opens a
group of 1 + that many ranks. The trainer is rank 0, the only sender; each vLLM worker joins at
rank 1 + dp_index x (TP x PCP x PP) + its rank within its replica, so every worker of every
data-parallel replica receives each full tensor by broadcast and shards it itself
(`load_weights`), as from a checkpoint. So `--engine-tensor-parallel-size 4
--engine-data-parallel-size 2` means a group of 9 and nothing to configure here. Several engines
(`--engine-url a,b`) are several groups, one per engine, each with its own rendezvous port
(trainer.weight_sync.fanout).

DECIDED ONCE, WITH THE REASON LOGGED: the path. CUDA in the trainer -> vLLM's "nccl" engine
(trainer.weight_sync.nccl); no CUDA -> "harness_gloo" (trainer.weight_sync.gloo, with the vLLM
plugin trainer.weight_sync.vllm_plugin on the engine side). The engine must have been started
with the same backend in `--weight-transfer-config`.

Pause mode "keep" by default: requests in flight (agents mid-rollout) are frozen, not aborted,
and continue after the resume; `clear_cache` drops their KV and the prefix cache, so every token
sampled after the resume comes from the new weights. The capture proxy stamps each turn with
the versions at its start and end, so the trainer sees exactly which turns straddle a sync.

Failure: any error after the pause resumes the engine, tears down the transfer group, and raises
`WeightSyncPushError` saying which step failed and whether the engine still serves the previous
version. On the gloo path the engine applies weights only when all of them have arrived, so a
failure before `/finish_weight_update` leaves it intact; vLLM's NCCL engine loads as tensors
arrive, so there a failure inside `/update_weights` leaves a partial model (restart the engine).

Multi-process trainers (torchrun + FSDP2): call `push` on every rank with the sharded model and
the ranks gather full tensors together (DTensor.full_tensor, a collective) while rank 0 sends; or
call `push` on rank 0 only with a `FullModelView` while the other ranks drain the same view
(trainer/loop.py does the latter). Either way one full parameter at a time exists, on the
parameters' device. Calling it on rank 0 alone with a sharded model deadlocks in the gather.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

import httpx
import torch
import torch.distributed as dist

from trainer.weight_sync.client import EngineControlClient
from trainer.weight_sync.errors import (
    WeightSyncError,
    WeightSyncPushError,
    WeightSyncSetupError,
)
from trainer.weight_sync.gloo import GlooTransport
from trainer.weight_sync.nccl import NcclTransport
from trainer.weight_sync.source import NameMap, iter_full_parameters
from trainer.weight_sync.wire import DEFAULT_CHUNK_BYTES

__all__ = ["PauseMode", "VLLMWeightSync", "WeightSync", "choose_backend"]

log = logging.getLogger(__name__)

PauseMode = Literal["keep", "wait", "abort"]
Backend = Literal["harness_gloo", "nccl"]


@runtime_checkable
class WeightSync(Protocol):
    """Pushes the trainer's weights into an inference engine after each update."""

    def push(self, model: Any, version: int) -> None: ...

    def close(self) -> None: ...


def choose_backend(requested: str | None = None) -> tuple[Backend, str]:
    """The weight-transfer backend for this trainer process, and why."""
    if requested is not None:
        if requested not in ("harness_gloo", "nccl"):
            raise ValueError(f"unknown weight sync backend {requested!r}: 'harness_gloo' or 'nccl'")
        return requested, f"backend={requested!r} was requested"  # type: ignore[return-value]
    if torch.cuda.is_available():
        return "nccl", "CUDA is available in the trainer: vLLM's NCCL engine"
    return "harness_gloo", "no CUDA in the trainer: gloo over TCP (vLLM plugin 'harness_gloo')"


def _this_rank() -> int:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return 0


class VLLMWeightSync:
    """`WeightSync` into one vLLM OpenAI server started with `--weight-transfer-config`.

    Args:
        engine_url: the server root, e.g. http://127.0.0.1:8000 (not .../v1).
        backend: "harness_gloo", "nccl", or None to decide from CUDA availability.
        on_version: called with the version after each successful push (and resume), e.g.
            `CaptureClient(...).set_weight_version`.
        pause_mode: how /pause treats requests in flight: "keep" (freeze, default), "wait"
            (let them finish first), "abort".
        master_address / master_port: where the trainer hosts the transfer group's rendezvous;
            it must be reachable from the engine's workers (port: a free one by default).
        chunk_bytes / group_timeout_s: gloo path only (see trainer.weight_sync.wire).
        http_timeout_s: per control-plane request; /update_weights lasts the whole transfer.
        name_map: parameter name -> checkpoint name, when the model's names are not the
            checkpoint's after stripping wrapper prefixes (see trainer.weight_sync.source).
        rank: this trainer process's rank (default: torch.distributed's, else 0).
        http_transport: an httpx transport, for tests that fake the engine.
    """

    def __init__(
        self,
        engine_url: str,
        backend: str | None = None,
        *,
        on_version: Callable[[int], Any] | None = None,
        pause_mode: PauseMode = "keep",
        clear_cache: bool = True,
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        group_timeout_s: float = 300.0,
        http_timeout_s: float = 600.0,
        name_map: NameMap | None = None,
        rank: int | None = None,
        http_transport: httpx.BaseTransport | None = None,
    ) -> None:
        if pause_mode not in ("keep", "wait", "abort"):
            raise ValueError(f"pause_mode must be 'keep', 'wait' or 'abort', got {pause_mode!r}")
        self.backend, self.reason = choose_backend(backend)
        self.engine_url = engine_url.rstrip("/")
        self.on_version = on_version
        self.pause_mode = pause_mode
        self.clear_cache = clear_cache
        self.name_map = name_map
        self.rank = _this_rank() if rank is None else rank
        self.version: int | None = None  # the last version the engine confirmed
        self.client = EngineControlClient(
            self.engine_url, timeout_s=http_timeout_s, transport=http_transport
        )
        self.transport: GlooTransport | NcclTransport
        if self.backend == "nccl":
            self.transport = NcclTransport(
                master_address=master_address, master_port=master_port, name_map=name_map
            )
        else:
            self.transport = GlooTransport(
                master_address=master_address,
                master_port=master_port,
                chunk_bytes=chunk_bytes,
                timeout_s=group_timeout_s,
                name_map=name_map,
            )
        if self.rank == 0:
            log.info("weight sync: %s into %s (%s)", self.backend, self.engine_url, self.reason)

    # -- the protocol --------------------------------------------------------------------------
    def push(self, model: Any, version: int) -> None:
        """Make the engine serve `model`'s current weights as `version`. Blocks until it does."""
        if self.rank != 0:
            # Join the gather collectives (FSDP2 shards) in the order rank 0 runs them.
            for _ in iter_full_parameters(model, self.name_map):
                pass
            return
        self._connect()
        self.transport.stage = "pause"
        try:
            self.client.pause(self.pause_mode, self.clear_cache)
        except WeightSyncSetupError:
            raise
        except WeightSyncError as exc:
            raise WeightSyncPushError(
                f"weight sync of version {version}: /pause failed, nothing was changed: {exc}",
                stage="pause",
                engine_resumed=False,
                weights_intact=True,
            ) from exc
        try:
            self.transport.send(self.client, model, str(version))
        except BaseException as exc:
            raise self._failed(version, exc) from exc
        try:
            self.client.resume()
        except WeightSyncError as exc:
            raise WeightSyncPushError(
                f"weight sync of version {version}: the weights were applied but /resume "
                f"failed, so the engine is still paused: {exc}. POST {self.engine_url}/resume "
                "to serve again.",
                stage="resume",
                engine_resumed=False,
                weights_intact=True,
            ) from exc
        self.version = version
        if self.on_version is not None:
            self.on_version(version)

    def close(self) -> None:
        """Release the transfer group on both sides (the engine keeps serving)."""
        if self.rank == 0 and self.transport.connected:
            with contextlib.suppress(WeightSyncError):
                self.client.shutdown_weight_transfer_engine()
        self.transport.close()
        self.client.close()

    def __enter__(self) -> VLLMWeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------
    def _connect(self) -> None:
        if self.transport.connected:
            return
        world_size = self.client.world_size()  # 404 here: dev mode is off (client says so)
        try:
            self.transport.connect(self.client, world_size)
        except WeightSyncSetupError:
            self.transport.close()
            raise
        except Exception as exc:
            self.transport.close()
            raise WeightSyncSetupError(
                f"could not open the {self.backend} weight-transfer group with {self.engine_url} "
                f"({type(exc).__name__}: {exc}). The engine must run with --weight-transfer-config "
                f"'{{\"backend\": \"{self.backend}\"}}' and its workers must reach "
                f"{self.transport.master_address} (set master_address to an address they can)."
            ) from exc

    def _failed(self, version: int, exc: BaseException) -> WeightSyncPushError:
        """After a failure past the pause: tear down, resume, and say what state we left."""
        stage = self.transport.stage
        # The group may hold half a transfer: drop it; the next push opens a fresh one.
        self.transport.close()
        resumed = True
        resume_error = ""
        try:
            self.client.resume()
        except WeightSyncError as resume_exc:
            resumed, resume_error = False, f" /resume failed too ({resume_exc})."
        # gloo applies only at finish (all or nothing before it); NCCL loads as tensors arrive.
        applying = {"harness_gloo": ("finish_weight_update",), "nccl": ("update_weights",)}
        intact = stage not in applying[self.backend] and stage != "finish_weight_update"
        if intact:
            state = f"the engine still serves version {self.version}"
        else:
            state = (
                "the engine's weights may be partly updated: restart the engine before sampling "
                "from it again"
            )
        message = (
            f"weight sync of version {version} failed at {stage} "
            f"({type(exc).__name__}: {exc}); {state}; "
            f"{'it was resumed' if resumed else 'it is still paused'}.{resume_error}"
        )
        return WeightSyncPushError(
            message, stage=stage, engine_resumed=resumed, weights_intact=intact
        )
