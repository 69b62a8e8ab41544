# .venv/bin/python -m pytest tests/test_weight_sync_fsdp.py -x -q
"""Weight sync from a 2-process FSDP2 trainer (CPU, gloo): shards are gathered, rank 0 sends.

Both ranks call `push` with the sharded model: the ranks all-gather each parameter together
(`DTensor.full_tensor()`), and only rank 0 talks to the engine. The engine here is the fake
(trainer.weight_sync.fake_engine), which receives the bytes over the real gloo wire.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.weight_sync.fake_engine import FakeWeightTransferEngine


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Embedding(32, 16),
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()),
        torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, engine_url: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from trainer.weight_sync import VLLMWeightSync

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        model = build_model()
        for block in list(model)[1:]:
            fully_shard(block)
        fully_shard(model)
        assert any(hasattr(p, "full_tensor") for p in model.parameters()), "not sharded"
        with VLLMWeightSync(engine_url, "harness_gloo", group_timeout_s=60) as sync:
            assert sync.rank == rank
            sync.push(model, 1)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def fsdp_push():
    with FakeWeightTransferEngine() as fake:
        mp.spawn(_rank_main, args=(2, free_port(), fake.url), nprocs=2, join=True)
        yield fake


def test_the_engine_receives_full_unsharded_tensors_from_a_sharded_model(fsdp_push):
    expected = dict(build_model().named_parameters())
    assert set(fsdp_push.weights) == set(expected)
    for name, tensor in expected.items():
        assert fsdp_push.weights[name].shape == tensor.shape, name
        assert torch.equal(fsdp_push.weights[name], tensor.detach()), name


def test_only_rank_zero_talks_to_the_engine(fsdp_push):
    assert fsdp_push.paths.count("/update_weights") == 1
    assert fsdp_push.paths.count("/init_weight_transfer_engine") == 1
    assert fsdp_push.weight_version == "1"
