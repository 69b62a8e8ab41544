"""Trainer side of vLLM's own "nccl" backend, for GPU machines.

Nothing here re-implements NCCL transfer: it drives vLLM's trainer-side engine
(`vllm.distributed.weight_transfer.nccl_engine.NCCLTrainerWeightTransferEngine`, built through
`WeightTransferTrainerFactory`), which opens the trainer endpoint as NCCL rank 0 over vLLM's
`StatelessProcessGroup` rendezvous and runs start -> update (concurrent with the broadcast) ->
finish through the client it is given. The worker side is vLLM's `NCCLWeightTransferEngine`,
selected by `--weight-transfer-config '{"backend": "nccl"}'`.

Consequence: `vllm` must be importable in the trainer process (the rendezvous speaks vLLM's
store protocol and uses vLLM's NCCL wrapper). It is imported lazily, and a missing install is a
`WeightSyncSetupError` naming the fix. This path cannot run on the CPU machines Harness is
developed on; its tests cover the request sequence and the errors, not the bytes.

vLLM's engine calls `finish_weight_update()` without a version, so the client handed to it
(`_StagedClient`) adds the push's version and records which step is in flight.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from launchers.net import free_port
from trainer.weight_sync.client import EngineControlClient
from trainer.weight_sync.errors import WeightSyncSetupError
from trainer.weight_sync.source import NameMap, iter_full_parameters, parameter_metas

__all__ = ["NcclTransport"]

log = logging.getLogger(__name__)


def _import_vllm_nccl() -> tuple[Any, Any, Any, Any]:
    try:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo
    except ImportError as exc:
        raise WeightSyncSetupError(
            "the NCCL weight sync drives vLLM's own trainer-side NCCL engine, so `vllm` must be "
            "importable in the trainer process (`import vllm` failed: "
            f"{exc}). Install the engine's vLLM version into the trainer's environment, or use "
            "backend='harness_gloo' (CPU, no vLLM needed in the trainer)."
        ) from exc
    return ParamMeta, WeightSource, WeightTransferTrainerFactory, NCCLTrainerInitInfo


class _StagedClient:
    """The `VLLMWeightSyncClient` given to vLLM's engine: adds the version, records the step."""

    def __init__(self, client: EngineControlClient, transport: NcclTransport) -> None:
        self._client = client
        self._transport = transport

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._transport.stage = "init_weight_transfer_engine"
        self._client.init_weight_transfer_engine(init_info)

    def start_weight_update(self) -> None:
        self._transport.stage = "start_weight_update"
        self._client.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self._transport.stage = "update_weights"
        self._client.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._transport.stage = "finish_weight_update"
        self._client.finish_weight_update(weight_version or self._transport.pending_version)


class NcclTransport:
    """vLLM's dense NCCL weight transfer, trainer rank 0 as the sender."""

    backend = "nccl"

    def __init__(
        self,
        *,
        master_address: str = "127.0.0.1",
        master_port: int | None = None,
        packed: bool = True,
        name_map: NameMap | None = None,
    ) -> None:
        self.master_address = master_address
        self.master_port = master_port
        self.packed = packed
        self.name_map = name_map
        self.stage = "idle"
        self.pending_version: str | None = None
        self._model: torch.nn.Module | None = None
        self._engine: Any = None

    @property
    def connected(self) -> bool:
        return self._engine is not None

    def _source(self) -> Any:
        param_meta, weight_source, _, _ = _import_vllm_nccl()
        transport = self

        class _ModelSource(weight_source):  # type: ignore[misc, valid-type]
            """The model of the push in progress, under checkpoint names (see source.py)."""

            def metadata(self) -> list[Any]:
                assert transport._model is not None
                return [
                    param_meta(m.name, getattr(torch, m.dtype), m.shape)
                    for m in parameter_metas(transport._model, transport.name_map)
                ]

            def __iter__(self):
                assert transport._model is not None
                return iter_full_parameters(transport._model, transport.name_map)

        return _ModelSource()

    def connect(self, client: EngineControlClient, engine_world_size: int) -> None:
        _, _, factory, init_info_cls = _import_vllm_nccl()
        port = self.master_port or free_port(self.master_address)
        init_info = init_info_cls(
            master_address=self.master_address,
            master_port=port,
            world_size=1 + engine_world_size,
            packed=self.packed,
            rank=0,
        )
        self._engine = factory.trainer_init(
            init_info, client=_StagedClient(client, self), source=self._source()
        )
        log.info(
            "weight sync: NCCL group open on %s:%d with %d vLLM worker(s)",
            self.master_address,
            port,
            engine_world_size,
        )

    def send(self, client: EngineControlClient, model: torch.nn.Module, weight_version: str) -> None:
        if self._engine is None:
            raise RuntimeError("NcclTransport.send before connect")
        self._model, self.pending_version = model, weight_version
        try:
            self._engine.send_weights()  # start -> update + broadcast -> finish
        finally:
            self._model = None
        self.stage = "done"

    def close(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown()
