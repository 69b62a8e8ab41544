"""The CPU weight wire: a gloo group between the trainer and vLLM's workers, and its byte layout.

Both ends import this module: the trainer (project venv) and the vLLM workers (engine venv, where
only torch, vLLM and the stdlib are installed). So it imports torch and the stdlib, nothing else,
and it never imports vLLM.

THE ONE DECISION: both sides derive the same chunk plan from the same metadata. The trainer tells
the engine, over HTTP, the names, dtypes and shapes it is about to send and the chunk size it uses;
each side then cuts the parameter list into the same chunks (`plan_chunks`), and every chunk
crosses as one flat uint8 buffer in a single gloo broadcast. Nothing about the layout travels on
the wire itself, so a disagreement shows up as a size check failing here, not as garbage weights.

The group is "stateless": built from a TCPStore and a `ProcessGroupGloo` directly, never through
`torch.distributed.init_process_group`. The trainer may already own the default group (FSDP2 under
torchrun) and every vLLM worker does (vLLM's own TP group), so neither side may touch it.
Ranks: the trainer is 0 and hosts the store; vLLM worker i (TP/PP rank, across DP replicas) is
`1 + i`. Everything is broadcast from rank 0, so every worker receives the full checkpoint-format
weights and lets vLLM's `load_weights` shard them, exactly as vLLM's NCCL engine does.

No thread waits inside torch's C++ for a peer that may never come: joining polls a counter in the
store and a broadcast polls its work handle, and both run `exit_guard.guarded()`, so a process
that exits while a push is stuck exits cleanly instead of aborting (see that module).

What this module does not do: retry, or survive a peer dying mid-broadcast. A failed collective
leaves the group unusable; callers tear it down and open a new one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from launchers.net import address_toward
from trainer.weight_sync.exit_guard import guarded, poll_until

__all__ = [
    "ALIGN_BYTES",
    "DEFAULT_CHUNK_BYTES",
    "GlooGroup",
    "TensorMeta",
    "chunk_sizes",
    "dtype_from_name",
    "dtype_name",
    "gloo_address",
    "open_gloo_group",
    "pack_chunk",
    "plan_chunks",
    "unpack_chunk",
]

# 64 MiB per broadcast: large enough that per-call overhead vanishes (a broadcast on loopback costs
# ~0.1 ms), small enough that the trainer's packing copy stays cheap next to the model itself.
DEFAULT_CHUNK_BYTES = 64 * 1024 * 1024
# Every tensor starts at a multiple of this inside a chunk, so `buffer[a:b].view(dtype)` is legal
# for every dtype (a view to a wider dtype needs an offset divisible by its element size).
ALIGN_BYTES = 64
_STORE_PREFIX = "harness_weight_sync"
_JOINED_KEY = "harness_ranks_joined"  # a counter each rank adds 1 to; not one of gloo's own keys
_ABANDONED: list[dist.ProcessGroupGloo] = []  # see GlooGroup.abandon


@dataclass(frozen=True)
class TensorMeta:
    """One parameter as it crosses the wire: checkpoint (HF) name, dtype name, full shape."""

    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * dtype_from_name(self.dtype).itemsize


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown torch dtype name {name!r} in weight update metadata")
    return dtype


def _aligned(offset: int) -> int:
    return (offset + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES


def plan_chunks(metas: Sequence[TensorMeta], chunk_bytes: int) -> list[list[int]]:
    """Cut the parameter list, in order, into chunks of at most `chunk_bytes` (aligned) bytes.

    Returns lists of indices into `metas`. A tensor larger than `chunk_bytes` gets a chunk of its
    own. Both ends call this with the same arguments; that is the whole layout contract.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    chunks: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index, meta in enumerate(metas):
        end = _aligned(size) + meta.nbytes
        if current and end > chunk_bytes:
            chunks.append(current)
            current, end = [], meta.nbytes
        current.append(index)
        size = end
    if current:
        chunks.append(current)
    return chunks


def _layout(metas: Sequence[TensorMeta]) -> tuple[list[int], int]:
    """Byte offsets of each tensor in its chunk buffer, and the buffer's total size."""
    offsets: list[int] = []
    size = 0
    for meta in metas:
        start = _aligned(size)
        offsets.append(start)
        size = start + meta.nbytes
    return offsets, size


def pack_chunk(metas: Sequence[TensorMeta], tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Copy `tensors` (any device, contiguous or not) into one flat CPU uint8 buffer."""
    offsets, size = _layout(metas)
    buffer = torch.empty(size, dtype=torch.uint8)
    for meta, offset, tensor in zip(metas, offsets, tensors, strict=True):
        flat = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        if flat.numel() != meta.nbytes:
            raise ValueError(
                f"parameter {meta.name!r} has {flat.numel()} bytes but its metadata declares "
                f"{meta.dtype}{list(meta.shape)} = {meta.nbytes} bytes"
            )
        buffer[offset : offset + meta.nbytes].copy_(flat)
    return buffer


def unpack_chunk(
    metas: Sequence[TensorMeta], buffer: torch.Tensor
) -> Iterator[tuple[str, torch.Tensor]]:
    """Views into `buffer`, one `(name, tensor)` per meta. They share the buffer's memory."""
    offsets, size = _layout(metas)
    if buffer.numel() != size:
        raise ValueError(f"chunk buffer holds {buffer.numel()} bytes, layout needs {size}")
    for meta, offset in zip(metas, offsets, strict=True):
        raw = buffer[offset : offset + meta.nbytes]
        yield meta.name, raw.view(dtype_from_name(meta.dtype)).view(meta.shape)


def chunk_sizes(metas: Sequence[TensorMeta], plan: Iterable[list[int]]) -> list[int]:
    return [_layout([metas[i] for i in chunk])[1] for chunk in plan]


class GlooGroup:
    """A 1-to-N gloo group outside torch.distributed's global state. Rank 0 sends."""

    def __init__(self, backend: dist.ProcessGroupGloo, store: dist.Store, rank: int, size: int):
        self._backend: dist.ProcessGroupGloo | None = backend
        self._store = store  # keep the store alive as long as the group: gloo uses it to reconnect
        self.rank = rank
        self.size = size

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Broadcast `buffer` from rank 0 into every rank's `buffer` (same size on all ranks)."""
        if self._backend is None:
            raise RuntimeError("the weight-sync gloo group is closed")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.rootTensor = 0
        with guarded():
            work = self._backend.broadcast([buffer], opts)
            # gloo's own timeout completes the work with an error, so this ends; wait() raises it
            poll_until(work.is_completed)
            work.wait()

    def abandon(self) -> None:
        """Forget the group without shutting it down, for when a collective is still blocked in
        another thread: `shutdown()` would wait for it. The blocked call ends at the timeout.

        Dropping the last reference blocks too (the destructor waits for the collective,
        measured), so the backend is parked in `_ABANDONED` for the life of the process: one
        leaked group per failed push, which is rare and cheaper than a stalled trainer."""
        if self._backend is not None:
            _ABANDONED.append(self._backend)
        self._backend = None

    def close(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            # Best effort: a peer that already died makes shutdown raise, and there is nothing
            # left to release on our side then.
            with contextlib.suppress(Exception):
                backend.shutdown()


def gloo_address(host: str) -> str | None:
    """The address this rank's gloo pairs listen on, for a group whose store is at `host`.

    Gloo's default is the address the machine's hostname resolves to, which need not be one the
    other ranks can reach. Measured in the multi-host rehearsal's namespaces (examples/multi_host;
    the hostname resolves to 127.0.0.1 through /etc/hosts, as on many machines): every rank
    advertised 127.0.0.1 and the group never formed ("Gloo connectFullMesh failed ... Connection
    refused, remote=[127.0.0.1]"). The address on the route to the store's host is reachable
    from it by construction (127.0.0.1 for a loopback store). None: `GLOO_SOCKET_IFNAME` is set,
    and gloo's own choice of that interface stands.
    """
    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return None
    return address_toward(host)


def open_gloo_group(
    host: str, port: int, rank: int, world_size: int, timeout_s: float
) -> GlooGroup:
    """Join (rank > 0) or host (rank 0) the weight-sync group. Blocks until all ranks have joined.

    Rank 0 listens on `host:port`. Every rank binds gloo to its own address on the route to
    `host` (`gloo_address`), unless `GLOO_SOCKET_IFNAME` names the interface.
    """
    with guarded():
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(
            host, port, world_size, is_master=(rank == 0), timeout=timeout, wait_for_workers=False
        )
        prefixed = dist.PrefixStore(_STORE_PREFIX, store)
        # Every rank is in the store before gloo's constructor runs, so that constructor (which
        # blocks in C++ until the mesh is complete) finds its peers at once (module docstring).
        prefixed.add(_JOINED_KEY, 1)
        if not poll_until(lambda: prefixed.add(_JOINED_KEY, 0) >= world_size, timeout_s):
            joined = prefixed.add(_JOINED_KEY, 0)
            raise TimeoutError(
                f"only {joined} of {world_size} ranks joined the weight-sync gloo group at "
                f"{host}:{port} within {timeout_s:g} s: a vLLM worker never called "
                "init_weight_transfer_engine, or cannot reach this address"
            )
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        address = gloo_address(host)
        options._devices = [
            dist.ProcessGroupGloo.create_default_device()
            if address is None
            else dist.ProcessGroupGloo.create_device(hostname=address)
        ]
        backend = dist.ProcessGroupGloo(prefixed, rank, world_size, options)
        return GlooGroup(backend, store, rank, world_size)
