# .venv/bin/python -m pytest tests/test_weight_sync_nccl.py -x -q
"""The NCCL path's control plane, driven by vLLM's own trainer-side NCCL engine.

The NCCL data plane needs GPUs, so it cannot run here. What can: vLLM 0.32's real
`NCCLTrainerWeightTransferEngine` (handshake, metadata, the concurrent update, finish) driving our
`VLLMWeightSync` and HTTP client against the fake engine, with only the two NCCL calls replaced
(the endpoint and the packed broadcast). It runs in the engine venv, the only one with vLLM.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from launchers.paths import REPO_ROOT, SetupMissingError, engine_python
from trainer.weight_sync.fake_engine import FakeWeightTransferEngine

TRAINER = r"""
import sys, torch
import vllm.distributed.weight_transfer.nccl_engine as nccl_engine

class NoGpuCommunicator:  # stands in for PyNcclCommunicator; records what would be sent
    sent = []
    def broadcast(self, tensor, src, stream=None): self.sent.append(tensor.numel())
    def destroy(self): pass

def packed_producer(iterator, group, src, post_iter_func, buffer_size_bytes, num_buffers):
    for item in iterator:
        group.broadcast(post_iter_func(item), src)

nccl_engine.open_trainer_endpoint = lambda init_info: NoGpuCommunicator()
nccl_engine.packed_nccl_broadcast_producer = packed_producer

from trainer.weight_sync import VLLMWeightSync
from trainer.weight_sync.source import FullModelView
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
seen = []
if sys.argv[2] == "view":
    # what the trainer sends: fp32 master weights cast to bf16, streamed; vLLM's engine checks
    # every streamed tensor against the declared metadata (_checked_iter)
    model = FullModelView(model, torch.bfloat16)
with VLLMWeightSync(sys.argv[1], "nccl", on_version=seen.append) as sync:
    sync.push(model, 5)
assert seen == [5], seen
print("sent", sum(NoGpuCommunicator.sent))
"""


def _run(what: str):
    try:
        python = engine_python()
    except SetupMissingError as exc:
        pytest.skip(f"no engine venv (the only one with vLLM): {exc}")
    with FakeWeightTransferEngine(receive=False) as fake:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        result = subprocess.run(
            [str(python), "-c", TRAINER, fake.url, what],
            capture_output=True, text=True, env=env, timeout=300,
        )
        assert result.returncode == 0, result.stderr[-4000:]
        yield fake, result.stdout


@pytest.fixture(scope="module")
def nccl_run():
    yield from _run("model")


@pytest.fixture(scope="module")
def nccl_view_run():
    yield from _run("view")


def test_vllms_nccl_engine_runs_the_protocol_in_order_through_our_client(nccl_run):
    fake, _ = nccl_run
    assert fake.paths == [
        "/get_world_size",
        "/init_weight_transfer_engine",
        "/pause",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/resume",
        "/shutdown_weight_transfer_engine",
    ]


def test_a_cast_view_declares_and_streams_bf16_through_vllms_engine(nccl_view_run):
    # vLLM's _checked_iter raises if a streamed tensor's dtype differs from the declared one,
    # so this push passing means the stream really was bf16, element by element.
    fake, stdout = nccl_view_run
    update = dict(fake.requests)["/update_weights"]["update_info"]
    assert update["dtype_names"] == ["bfloat16"] * 4
    assert update["shapes"] == [[3, 4], [3], [2, 3], [2]]
    assert stdout.split()[-1] == str(12 + 3 + 6 + 2)


def test_the_workers_are_told_to_join_after_the_trainer_as_rank_one(nccl_run):
    fake, _ = nccl_run
    init = dict(fake.requests)["/init_weight_transfer_engine"]["init_info"]
    assert (init["rank_offset"], init["world_size"], init["packed"]) == (1, 2, True)


def test_the_update_names_every_parameter_with_dtype_and_shape(nccl_run):
    fake, stdout = nccl_run
    update = dict(fake.requests)["/update_weights"]["update_info"]
    assert update["names"] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert update["dtype_names"] == ["float32"] * 4
    assert update["shapes"] == [[3, 4], [3], [2, 3], [2]]
    assert stdout.split()[-1] == str(12 + 3 + 6 + 2)  # every element went to the broadcast


def test_the_version_vllm_leaves_out_is_added_to_finish(nccl_run):
    fake, _ = nccl_run
    # vLLM's engine calls finish_weight_update() without a version; ours carries the push's
    assert dict(fake.requests)["/finish_weight_update"] == {"weight_version": "5"}
