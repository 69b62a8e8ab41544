"""The weight stream of bench/gpu/check.py: `push_weights` into a second process, and timed.

Each path is a WeightSync (trainer.grpo.WeightSync) fed by the project's own `push_weights`
(`FullModelView`: one parameter at a time, cast to the compute dtype on the device), so what is
timed is the trainer's gathering plus the transport:

    nccl / gloo   `dist.broadcast` of each tensor to rank 1 (NCCL needs a second GPU: it refuses
                  two ranks on one device)
    ipc           a staging buffer on the device, mapped by the peer through CUDA IPC (shared
                  memory on the CPU); the peer copies each filled buffer out, then acks

The peer allocates every tensor up front, receives, and reports a checksum per tensor, compared
with the sender's own: a transfer is only counted if every byte arrived.
"""

from __future__ import annotations

import math
import socket
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["stream_only", "sync_device", "transfer"]


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _BroadcastSync:
    """A WeightSync (trainer.grpo.WeightSync) that broadcasts each streamed tensor to rank 1."""

    def __init__(self, group: Any) -> None:
        self.group, self.bytes, self.tensors = group, 0, 0

    def push(self, model: Any, version: int) -> None:
        for _, tensor in model.named_parameters():
            dist.broadcast(tensor.contiguous(), src=0, group=self.group)
            self.bytes += tensor.numel() * tensor.element_size()
            self.tensors += 1


class _IpcSync:
    """A WeightSync that packs streamed tensors into a staging buffer the receiver maps (IPC)."""

    def __init__(self, buffer: torch.Tensor, conn: Any) -> None:
        self.buffer, self.conn, self.bytes, self.tensors = buffer, conn, 0, 0

    def _flush(self, items: list) -> None:
        sync_device(self.buffer.device)
        self.conn.send(items)
        assert self.conn.recv() == "copied"

    def push(self, model: Any, version: int) -> None:
        items, offset = [], 0
        for name, tensor in model.named_parameters():
            n = tensor.numel()
            if offset + n > self.buffer.numel():
                self._flush(items)
                items, offset = [], 0
            self.buffer[offset:offset + n].copy_(tensor.reshape(-1))
            items.append((name, offset, n))
            offset += n
            self.bytes += n * tensor.element_size()
            self.tensors += 1
        self._flush(items)
        self.conn.send(None)


def _receiver(kind: str, metas: list, device: str, init: str | None, conn: Any, result: Any) -> None:
    """Rank 1 / the IPC peer: receive every tensor into its own buffers, report checksums."""
    try:
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        store = {name: torch.empty(shape, dtype=dtype, device=dev) for name, dtype, shape in metas}
        if kind == "ipc":
            buffer = conn.recv()  # a CUDA tensor arrives as an IPC handle (shared memory on CPU)
            conn.send("ready")
            while (items := conn.recv()) is not None:
                for name, offset, n in items:
                    store[name].reshape(-1).copy_(buffer[offset:offset + n])
                sync_device(dev)
                conn.send("copied")
        else:
            backend = "nccl" if kind == "nccl" else "gloo"
            dist.init_process_group(backend, init_method=init, rank=1, world_size=2)
            for name, _, _ in metas:
                dist.broadcast(store[name], src=0)
            sync_device(dev)
            dist.destroy_process_group()
        result.put({"ok": True, "checksums": {n: float(t.double().sum()) for n, t in store.items()}})
    except BaseException as exc:  # the parent reports it; a silent child would hang the check
        result.put({"ok": False, "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:]})


def transfer(trainer: Any, kind: str, peer_device: str, copy_GBps: float | None) -> dict:
    """push_weights(trainer) into a second process over `kind` (nccl | gloo | ipc)."""
    from trainer.loop import push_weights
    from trainer.weight_sync.source import FullModelView

    metas = FullModelView(trainer.model, trainer.compute_dtype).describe_parameters()
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    parent, child = ctx.Pipe()
    init = f"tcp://127.0.0.1:{_free_port()}" if kind != "ipc" else None
    peer = ctx.Process(target=_receiver, args=(kind, metas, peer_device, init, child, result))
    peer.start()
    device = trainer.dist.device
    try:
        if kind == "ipc":
            largest = max(math.prod(shape) for _, _, shape in metas)
            buffer = torch.empty(max(largest, 64 * 2**20), dtype=metas[0][1], device=device)
            if device.type == "cpu":
                buffer.share_memory_()
            parent.send(buffer)
            if parent.recv() != "ready":  # the peer is up and mapped the buffer: time from here
                raise RuntimeError("the IPC peer did not map the staging buffer")
            trainer.weight_sync = sync = _IpcSync(buffer, parent)
        else:
            dist.init_process_group("nccl" if kind == "nccl" else "gloo", init_method=init,
                                    rank=0, world_size=2)
            trainer.weight_sync = sync = _BroadcastSync(None)
        sync_device(device)
        t0 = time.perf_counter()
        push_weights(trainer, version=1)
        sync_device(device)
        seconds = time.perf_counter() - t0
        if kind != "ipc":
            dist.destroy_process_group()
        peer_result = result.get(timeout=600)
    finally:
        trainer.weight_sync = None
        peer.join(timeout=60)
        if peer.is_alive():
            peer.kill()
    if not peer_result["ok"]:
        return {"kind": kind, "error": peer_result["error"], "traceback": peer_result["traceback"]}
    ours = {n: float(t.double().sum()) for n, t in FullModelView(
        trainer.model, trainer.compute_dtype).named_parameters()}
    gbps = sync.bytes / seconds / 1e9
    return {"kind": kind, "peer_device": peer_device, "tensors": sync.tensors, "bytes": sync.bytes,
            "seconds": seconds, "GBps": gbps,
            "ratio_to_copy": gbps / copy_GBps if copy_GBps else None,
            "checksums_match": ours == peer_result["checksums"]}


def stream_only(trainer: Any) -> dict:
    """The gather + cast stream alone (no sending): push_weights with a sync that only reads."""
    from trainer.loop import push_weights

    class _Read:
        bytes = 0

        def push(self, model: Any, version: int) -> None:
            for _, t in model.named_parameters():
                self.bytes += t.numel() * t.element_size()

    device = trainer.dist.device
    trainer.weight_sync = reader = _Read()
    sync_device(device)
    t0 = time.perf_counter()
    push_weights(trainer, version=1)
    sync_device(device)
    seconds = time.perf_counter() - t0
    trainer.weight_sync = None
    return {"bytes": reader.bytes, "seconds": seconds, "GBps": reader.bytes / seconds / 1e9}
