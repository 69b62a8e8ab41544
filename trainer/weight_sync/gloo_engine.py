"""vLLM worker side of the "harness_gloo" weight-transfer backend (runs inside vLLM's workers).

vLLM 0.32 ships weight-transfer engines for GPUs only (nccl, ipc, ...). Its CPU worker
(`vllm/v1/worker/cpu_worker.py`) subclasses the GPU `Worker`, so it inherits the whole protocol
(`init_weight_transfer_engine`, `start_weight_update`, `update_weights`, `finish_weight_update`)
and builds whatever engine `--weight-transfer-config {"backend": NAME}` names from
`WeightTransferEngineFactory`. No hook is missing; only a CPU transport is. This module is that
transport, registered by `trainer.weight_sync.vllm_plugin.register` (a `vllm.general_plugins`
entry point, loaded in every vLLM process).

Modelled on vLLM's `NCCLWeightTransferEngine`, with two deliberate differences:

1. RECEIVE ALL, THEN APPLY. The NCCL engine puts the model into layerwise-reload state at
   `start_weight_update` and loads each tensor as it arrives. A transfer that dies halfway then
   leaves layers on the meta device and the engine unable to serve. Here `update_weights` only
   receives into CPU buffers; `finish_weight_update` applies everything at once. A failed transfer
   therefore leaves the engine serving the previous weights. Cost: one extra copy of the weights
   in host memory during a sync, which a CPU engine has.
2. The layerwise reload is not optional on CPU. vLLM's CPU linear layers repack their weight
   into a oneDNN/sgl kernel handle at load time and replace `layer.weight` with an empty tensor
   (`dispatch_cpu_unquantized_gemm(..., remove_weight=True)`), so a plain `load_weights` would
   neither fit nor reach the kernel. `initialize_layerwise_reload` / `finalize_layerwise_reload`
   restore the original parameters, load, and re-run `process_weights_after_loading`, which
   repacks.

Also: the base class's `update_weights` ends with `torch.accelerator.synchronize()`. In the
engine venv torch is a CUDA build, so on a GPU-less host the "current accelerator" is CUDA with no
device, and that call raises. Gloo is synchronous; this engine overrides `update_weights` and
never synchronizes a device.

Imports: torch, vLLM and `trainer.weight_sync.wire` (torch + stdlib) only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.logger import init_logger

from trainer.weight_sync.wire import (
    DEFAULT_CHUNK_BYTES,
    GlooGroup,
    TensorMeta,
    chunk_sizes,
    open_gloo_group,
    plan_chunks,
    unpack_chunk,
)

__all__ = [
    "GlooWeightTransferInitInfo",
    "GlooWeightTransferUpdateInfo",
    "HarnessGlooWeightTransferEngine",
]

# Under the "vllm." namespace so that vLLM's logging config (handlers, levels) applies to it.
logger = init_logger("vllm.harness_gloo")


@dataclass
class GlooWeightTransferInitInfo(WeightTransferInitInfo):
    """What `/init_weight_transfer_engine` carries for "harness_gloo" (sent by the trainer)."""

    master_address: str
    master_port: int
    world_size: int  # 1 trainer + every vLLM worker across DP replicas
    rank_offset: int = 1
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout_s: float = 300.0


@dataclass
class GlooWeightTransferUpdateInfo(WeightTransferUpdateInfo):
    """What one `/update_weights` carries: the parameters about to be broadcast, in order."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise ValueError(
                "names, dtype_names and shapes must have the same length, got "
                f"{len(self.names)}, {len(self.dtype_names)}, {len(self.shapes)}"
            )

    def metas(self) -> list[TensorMeta]:
        return [
            TensorMeta(name, dtype, tuple(shape))
            for name, dtype, shape in zip(self.names, self.dtype_names, self.shapes, strict=True)
        ]


def _refresh_tied_cpu_kernels(model: torch.nn.Module) -> int:
    """Re-pack the CPU GEMM kernel of every layer that keeps its weight (embeddings, LM heads).

    Why: with tied embeddings (`tie_word_embeddings`, the tiny model's case) `lm_head.weight` IS
    `embed_tokens.weight`, but on CPU `lm_head` computes logits through its own packed copy
    (`layer.cpu_linear`, built once by `process_weights_after_loading`). The checkpoint has no
    `lm_head.weight`, so the layerwise reload never re-processes `lm_head` and its packed copy
    keeps the OLD embedding: measured on the tiny model, every other tensor matched the trainer to
    1e-6 after a sync while a perturbed embedding left logprobs off by 0.7. vLLM documents the
    limitation ("Tied parameters will only reflect processing from one of the parent layers").
    Linear layers drop their weight after packing (`remove_weight=True`) and are re-packed by
    the reload itself, so only layers that still hold a weight are re-processed here.
    """
    refreshed = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        quant_method = getattr(module, "quant_method", None)
        if (
            hasattr(module, "cpu_linear")
            and isinstance(weight, torch.Tensor)
            and weight.numel() > 0
            and quant_method is not None
        ):
            quant_method.process_weights_after_loading(module)
            refreshed += 1
    return refreshed


class HarnessGlooWeightTransferEngine(
    WeightTransferEngine[GlooWeightTransferInitInfo, GlooWeightTransferUpdateInfo]
):
    """Receives checkpoint-format weights over gloo from trainer rank 0; applies at finish."""

    init_info_cls = GlooWeightTransferInitInfo
    update_info_cls = GlooWeightTransferUpdateInfo
    # The draft model path would work the same way, but nothing here exercises it.
    supports_draft_weight_update = False

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: GlooGroup | None = None
        self.chunk_bytes = DEFAULT_CHUNK_BYTES
        self._pending: list[tuple[str, torch.Tensor]] = []

    def init_transfer_engine(self, init_info: GlooWeightTransferInitInfo) -> None:
        if self.group is not None:
            # A trainer that restarts (or recovers from a failed sync) opens a fresh group.
            self.shutdown()
        parallel = self.parallel_config
        # Unique rank across DP replicas, as vLLM's NCCL engine computes it.
        worker_rank = parallel.data_parallel_index * parallel.world_size + parallel.rank
        rank = worker_rank + init_info.rank_offset
        logger.info(
            "harness_gloo: joining %s:%d as rank %d of %d",
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
        )
        self.chunk_bytes = init_info.chunk_bytes
        self.group = open_gloo_group(
            init_info.master_address,
            init_info.master_port,
            rank,
            init_info.world_size,
            init_info.timeout_s,
        )

    def start_weight_update(self) -> None:
        # Buffers from an update that never finished (the trainer died) are dropped here.
        self._pending = []

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: GlooWeightTransferUpdateInfo) -> None:
        if self.group is None:
            raise RuntimeError(
                "harness_gloo weight transfer is not initialized: the trainer must call "
                "/init_weight_transfer_engine before /update_weights"
            )
        metas = update_info.metas()
        plan = plan_chunks(metas, self.chunk_bytes)
        received: list[tuple[str, torch.Tensor]] = []
        for chunk, size in zip(plan, chunk_sizes(metas, plan), strict=True):
            # A fresh buffer per chunk, never reused: the views below are kept until finish.
            buffer = torch.empty(size, dtype=torch.uint8)
            self.group.broadcast(buffer)
            received.extend(unpack_chunk([metas[i] for i in chunk], buffer))
        self._pending.extend(received)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        weights, self._pending = self._pending, []
        if not weights:
            logger.warning("harness_gloo: finish_weight_update with no weights received")
            return
        with torch.no_grad(), disable_mtp_completeness_check():
            initialize_layerwise_reload(self.model)
            self.model.load_weights(weights)
            finalize_layerwise_reload(self.model, self.model_config)
            refreshed = _refresh_tied_cpu_kernels(self.model)
        logger.info(
            "harness_gloo: applied %d tensors (re-packed %d tied CPU kernels)",
            len(weights),
            refreshed,
        )

    def shutdown(self) -> None:
        group, self.group = self.group, None
        self._pending = []
        if group is not None:
            group.close()
