# .venv/bin/python -m pytest tests/test_weight_sync.py -x -q
"""Weight sync against a fake engine: the protocol's order, versions, faults, and the gloo wire.

The fake (trainer.weight_sync.fake_engine) answers vLLM's weight-transfer routes over HTTP and
receives tensors for real over gloo, so the bytes checked here crossed a real process group.
The proof against vLLM itself is tests/test_weight_sync_engine.py.
"""

from __future__ import annotations

import logging
import time

import pytest
import torch

import trainer.weight_sync as weight_sync
from trainer.weight_sync import (
    VLLMWeightSync,
    WeightSync,
    WeightSyncPushError,
    WeightSyncSetupError,
    checkpoint_name,
    choose_backend,
)
from trainer.weight_sync.fake_engine import FakeWeightTransferEngine
from trainer.weight_sync.wire import TensorMeta, pack_chunk, plan_chunks, unpack_chunk

PUSH_SEQUENCE = [
    "/pause",
    "/start_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/resume",
]


class TinyNet(torch.nn.Module):
    """Parameters in several dtypes and shapes, named like a checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 6)
        self.scale = torch.nn.Parameter(torch.randn(()))  # 0-dim
        self.low = torch.nn.Parameter(torch.randn(5, 3).to(torch.bfloat16))


@pytest.fixture
def fake():
    with FakeWeightTransferEngine() as engine:
        yield engine


def make_sync(url: str, **kwargs) -> VLLMWeightSync:
    return VLLMWeightSync(url, "harness_gloo", **{"group_timeout_s": 30, "http_timeout_s": 30,
                                                   **kwargs})


def test_a_push_runs_pause_start_update_finish_resume_in_that_order(fake):
    with make_sync(fake.url) as sync:
        sync.push(TinyNet(), 1)
    # discovery and the one-time init come first, then exactly the protocol's five steps
    assert fake.paths[:2] == ["/get_world_size", "/init_weight_transfer_engine"]
    assert fake.paths[2:7] == PUSH_SEQUENCE


def test_pause_keeps_requests_in_flight_and_clears_the_cache_by_default(fake):
    with make_sync(fake.url) as sync:
        sync.push(TinyNet(), 1)
    pause = dict(fake.requests)["/pause"]
    assert (pause["mode"], pause["clear_cache"]) == ("keep", "true")


def test_every_parameter_arrives_byte_exact_across_several_chunks(fake):
    model = TinyNet()
    # 256-byte chunks: embed (50*8*4 = 1600 B) gets a chunk of its own, the rest share
    with make_sync(fake.url, chunk_bytes=256) as sync:
        sync.push(model, 1)
    sent = dict(model.named_parameters())
    assert set(fake.weights) == set(sent)
    for name, tensor in sent.items():
        assert fake.weights[name].dtype == tensor.dtype
        assert torch.equal(fake.weights[name], tensor.detach()), name


def test_the_version_reaches_finish_and_the_on_version_callback(fake):
    seen: list[int] = []
    with make_sync(fake.url, on_version=seen.append) as sync:
        sync.push(TinyNet(), 3)
        sync.push(TinyNet(), 4)
        assert sync.version == 4
    finishes = [body for path, body in fake.requests if path == "/finish_weight_update"]
    assert [body["weight_version"] for body in finishes] == ["3", "4"]  # vLLM takes a string
    assert seen == [3, 4]


def test_the_version_reaches_the_capture_proxy_through_set_weight_version(fake):
    from capture.client import CaptureClient
    from capture.server import CaptureServer

    with CaptureServer(fake.url) as proxy:
        client = CaptureClient(proxy.url, proxy.admin_key)
        with make_sync(fake.url, on_version=client.set_weight_version) as sync:
            sync.push(TinyNet(), 7)
        assert proxy.state.weight_version == 7  # turns starting now are stamped with version 7


def test_the_transfer_group_is_opened_once_for_many_pushes(fake):
    with make_sync(fake.url) as sync:
        for version in (1, 2, 3):
            sync.push(TinyNet(), version)
    assert fake.paths.count("/init_weight_transfer_engine") == 1
    assert fake.paths.count("/update_weights") == 3


def test_a_failed_update_resumes_the_engine_and_says_it_still_serves_the_old_version(fake):
    seen: list[int] = []
    with make_sync(fake.url, on_version=seen.append, group_timeout_s=300) as sync:
        sync.push(TinyNet(), 1)
        # the worker rejects the metadata and never joins the broadcast
        fake.fail["/update_weights"] = (500, '{"error": {"message": "bad update_info"}}')
        started = time.monotonic()
        with pytest.raises(WeightSyncPushError) as info:
            sync.push(TinyNet(), 2)
        # the blocked broadcast was aborted, not left to the group timeout (300 s here)
        assert time.monotonic() - started < 150
    error = info.value
    assert (error.stage, error.engine_resumed, error.weights_intact) == ("update_weights", True, True)
    assert "bad update_info" in str(error) and "still serves version 1" in str(error)
    assert fake.paths[-1] == "/resume" and not fake.paused
    assert seen == [1]  # the failed version never reaches the proxy


def test_after_a_failed_push_the_next_push_reopens_the_group_and_succeeds(fake):
    with make_sync(fake.url) as sync:
        fake.fail["/update_weights"] = (500, '{"error": {"message": "boom"}}')
        with pytest.raises(WeightSyncPushError):
            sync.push(TinyNet(), 1)
        del fake.fail["/update_weights"]
        sync.push(TinyNet(), 2)
    assert fake.paths.count("/init_weight_transfer_engine") == 2
    assert fake.weight_version == "2"


def test_a_failed_finish_says_the_engine_weights_may_be_partial_and_resumes(fake):
    fake.fail["/finish_weight_update"] = (500, '{"error": {"message": "load_weights: KeyError"}}')
    with make_sync(fake.url) as sync, pytest.raises(WeightSyncPushError) as info:
        sync.push(TinyNet(), 1)
    assert info.value.stage == "finish_weight_update"
    assert info.value.weights_intact is False
    assert "restart the engine" in str(info.value)
    assert fake.paths[-1] == "/resume"


def test_an_engine_without_dev_mode_is_named_and_never_paused():
    with FakeWeightTransferEngine(dev_mode=False) as fake, make_sync(fake.url) as sync:
        with pytest.raises(WeightSyncSetupError, match="VLLM_SERVER_DEV_MODE=1"):
            sync.push(TinyNet(), 1)
        assert "/pause" not in fake.paths


def test_an_engine_without_weight_transfer_config_names_the_flag():
    with FakeWeightTransferEngine(not_configured=True) as fake, make_sync(fake.url) as sync:
        with pytest.raises(WeightSyncSetupError, match="--weight-transfer-config"):
            sync.push(TinyNet(), 1)
        assert "/pause" not in fake.paths


def test_an_unreachable_engine_is_named_with_its_url():
    sync = make_sync("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(WeightSyncSetupError, match=r"cannot reach the engine at http://127.0.0.1:9"):
        sync.push(TinyNet(), 1)
    sync.close()


def test_a_gathered_state_view_with_only_named_parameters_can_be_pushed(fake):
    # a WeightSync written for gathered tensors (any object with named_parameters) is served
    class View:
        def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
            self._tensors = tensors

        def named_parameters(self):
            return iter(self._tensors.items())

    tensors = {"model.norm.weight": torch.rand(4), "lm_head.weight": torch.rand(3, 4)}
    with make_sync(fake.url) as sync:
        sync.push(View(tensors), 1)
    assert all(torch.equal(fake.weights[name], t) for name, t in tensors.items())


def test_a_full_model_view_crosses_the_wire_in_its_cast_dtype_read_once(fake):
    # What the trainer hands its WeightSync: fp32 master weights, sent as bf16, one at a time.
    from trainer.weight_sync.source import FullModelView

    net = TinyNet().float()
    view = FullModelView(net, torch.bfloat16)
    with make_sync(fake.url) as sync:
        sync.push(view, 1)
    update = dict(fake.requests)["/update_weights"]["update_info"]
    assert set(update["dtype_names"]) == {"bfloat16"}
    for name, param in net.named_parameters():
        assert torch.equal(fake.weights[name], param.detach().to(torch.bfloat16)), name
    assert view.read == len(list(net.parameters())) and view.finish() == 0
    with pytest.raises(RuntimeError, match="read once per push"):
        view.named_parameters()


def test_a_non_zero_rank_never_talks_to_the_engine(fake):
    with make_sync(fake.url, rank=1) as sync:
        sync.push(TinyNet(), 1)
    assert fake.requests == []


def test_the_backend_follows_cuda_availability_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert choose_backend()[0] == "harness_gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend, reason = choose_backend()
    assert backend == "nccl" and "CUDA" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.INFO, logger="trainer.weight_sync.sync"):
        VLLMWeightSync("http://127.0.0.1:9").close()
    assert "harness_gloo" in caplog.text and "no CUDA" in caplog.text


def test_the_nccl_path_without_vllm_in_the_trainer_names_the_fix(fake):
    try:
        import vllm  # noqa: F401

        pytest.skip("vllm is importable here; this test is about a trainer venv without it")
    except ImportError:
        pass
    with (
        VLLMWeightSync(fake.url, "nccl", http_timeout_s=30) as sync,
        pytest.raises(WeightSyncSetupError, match="importable in the trainer") as info,
    ):
        sync.push(TinyNet(), 1)
    assert "harness_gloo" in str(info.value)  # the alternative is named
    assert "/pause" not in fake.paths


def test_vllm_weight_sync_satisfies_the_weight_sync_protocol():
    sync = VLLMWeightSync("http://127.0.0.1:9", "harness_gloo")
    assert isinstance(sync, WeightSync)
    sync.close()


def test_wrapper_prefixes_are_stripped_to_checkpoint_names():
    assert (
        checkpoint_name("module._orig_mod.model.layers.0._checkpoint_wrapped_module.mlp.up.weight")
        == "model.layers.0.mlp.up.weight"
    )
    assert checkpoint_name("model.embed_tokens.weight") == "model.embed_tokens.weight"


def test_chunks_hold_at_most_chunk_bytes_and_a_big_tensor_gets_its_own():
    metas = [
        TensorMeta("a", "float32", (10,)),  # 40 B
        TensorMeta("b", "float32", (10,)),  # 40 B, aligned start 64 -> ends at 104
        TensorMeta("big", "float32", (100,)),  # 400 B > 128: alone
        TensorMeta("c", "bfloat16", (3,)),  # 6 B
    ]
    assert plan_chunks(metas, 128) == [[0, 1], [2], [3]]


def test_pack_and_unpack_round_trip_mixed_dtypes_and_non_contiguous_tensors():
    tensors = [torch.arange(12.0).reshape(3, 4).t(), torch.ones(3, dtype=torch.bfloat16)]
    metas = [TensorMeta("t", "float32", (4, 3)), TensorMeta("h", "bfloat16", (3,))]
    out = dict(unpack_chunk(metas, pack_chunk(metas, tensors)))
    assert torch.equal(out["t"], tensors[0]) and torch.equal(out["h"], tensors[1])


def test_the_package_exports_exactly_its_public_names():
    public = {name for name in dir(weight_sync) if not name.startswith("_")}
    modules = {
        "client", "errors", "exit_guard", "fake_engine", "fanout", "gloo", "lora", "nccl",
        "source", "sync", "wire",
        "vllm_plugin",
    }
    assert public - modules == set(weight_sync.__all__)
