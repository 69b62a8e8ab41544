# .venv/bin/python -m pytest tests/test_weight_sync_fanout.py -x -q
"""Weight sync into several engines (trainer.weight_sync.fanout) against fake engines.

The fakes (trainer.weight_sync.fake_engine) receive the tensors for real over gloo. Each test
attacks one property: every engine gets the same bytes and version; the version is told only
after the slowest engine finished; one engine's failed push retires it (and only it) and is named
to the proxy, which takes it out before stamping; a push that fails everywhere stops the run
and stamps nothing; `harness.train`'s wiring with two engines moves the real proxy's stamp;
the retirement reaches a rollout service's proxy through the ServicePool.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest
import torch

from capture.client import CaptureClient
from capture.server import CaptureServer
from harness.client.service_pool import ServicePool
from harness.train import weight_links
from tests.helpers.service import start_service
from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, synthetic_trace
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.weight_sync import (
    FanOutWeightSync,
    FullModelView,
    VLLMWeightSync,
    WeightSyncError,
    WeightSyncPushError,
    WeightSyncSetupError,
)
from trainer.weight_sync.fake_engine import FakeWeightTransferEngine


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)
        self.proj = torch.nn.Linear(8, 6)


class SlowFinish(FakeWeightTransferEngine):
    """Takes `delay_s` to finish each update: the last engine to serve a version."""

    delay_s = 0.6

    def handle(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if path == "/finish_weight_update":
            time.sleep(self.delay_s)
        return super().handle(method, path, body)


@pytest.fixture
def fakes():
    engines = [FakeWeightTransferEngine().start(), SlowFinish().start()]
    yield engines
    for engine in engines:
        engine.stop()


def make(fakes, on_version=None) -> FanOutWeightSync:
    return FanOutWeightSync([VLLMWeightSync(f.url, "harness_gloo", group_timeout_s=30,
                                            http_timeout_s=30) for f in fakes],
                            on_version=on_version)


def test_every_engine_receives_the_same_bytes_and_version(fakes):
    model = TinyNet()
    with make(fakes) as sync:
        sync.push(model, 1)
    for fake in fakes:
        assert fake.weight_version == "1"
        assert set(fake.weights) == {"embed.weight", "proj.weight", "proj.bias"}
        for name, param in model.named_parameters():
            assert torch.equal(fake.weights[name], param.detach())


def test_a_read_once_model_view_reaches_every_engine_whole(fakes):
    model = TinyNet()
    with make(fakes) as sync:
        sync.push(FullModelView(model), 1)  # each engine past the first reads a fresh view
    assert all(torch.equal(f.weights["proj.weight"], model.proj.weight.detach()) for f in fakes)


def test_the_version_is_told_only_after_the_slowest_engine_serves_it(fakes):
    told: list[tuple[int, list[str], list[str | None]]] = []

    def on_version(version: int, retired: list[str]) -> None:
        # what each engine serves at the moment the proxy would stamp `version`
        told.append((version, retired, [f.weight_version for f in fakes]))

    with make(fakes, on_version) as sync:
        sync.push(TinyNet(), 1)
        sync.push(TinyNet(), 2)
    # the slow engine finished 0.6 s after the other: a stamp at the first finish would see
    # [ "1", None ] here
    assert told == [(1, [], ["1", "1"]), (2, [], ["2", "2"])]


def test_one_engines_failed_push_retires_it_and_names_it_to_the_proxy(fakes):
    told: list[tuple[int, list[str]]] = []
    with make(fakes, lambda v, retired: told.append((v, retired))) as sync:
        sync.push(TinyNet(), 1)
        fakes[1].fail["/update_weights"] = (500, '{"error": {"message": "boom"}}')
        sync.push(TinyNet(), 2)
        assert sync.engine_urls == [fakes[0].url] and fakes[1].url in sync.retired
        pushes_before = fakes[1].paths.count("/pause")
        sync.push(TinyNet(), 3)  # the retired engine is never asked again
        assert fakes[1].paths.count("/pause") == pushes_before
    assert told == [(1, []), (2, [fakes[1].url]), (3, [])]
    assert (fakes[0].weight_version, fakes[1].weight_version) == ("3", "1")


def test_an_engine_that_died_is_retired_and_the_others_go_on(fakes):
    told: list[tuple[int, list[str]]] = []
    with make(fakes, lambda v, retired: told.append((v, retired))) as sync:
        sync.push(TinyNet(), 1)
        fakes[0].stop()  # refuses connections from now on
        sync.push(TinyNet(), 2)
    assert told == [(1, []), (2, [fakes[0].url])]
    assert fakes[1].weight_version == "2"


def test_a_push_that_fails_on_every_engine_stamps_nothing_and_says_no_engine_left(fakes):
    told: list[int] = []
    with make(fakes, lambda v, retired: told.append(v)) as sync:
        for fake in fakes:
            fake.fail["/update_weights"] = (500, '{"error": {"message": "boom"}}')
        with pytest.raises(WeightSyncPushError, match="no engine left") as caught:
            sync.push(TinyNet(), 1)
    assert all(f.url in str(caught.value) for f in fakes)
    assert told == []


def test_plain_sync_errors_on_every_engine_are_reported_not_an_index_error():
    # A failure that is neither a setup nor a push error (the control client's own WeightSyncError)
    # on every engine: the run stops with "no engine left" naming each, and stamps nothing.
    class Failing:
        on_version = None

        def __init__(self, url: str) -> None:
            self.engine_url = url

        def push(self, model: Any, version: int) -> None:
            raise WeightSyncError(f"{self.engine_url}: connection reset")

        def close(self) -> None:
            pass

    told: list[int] = []
    sync = FanOutWeightSync([Failing("http://a:1"), Failing("http://b:2")],
                            on_version=lambda v, retired: told.append(v))
    with pytest.raises(WeightSyncError, match="no engine left") as caught:
        sync.push(TinyNet(), 1)
    assert type(caught.value) is WeightSyncError
    assert "http://a:1" in str(caught.value) and "http://b:2" in str(caught.value)
    assert told == []


def test_a_misconfiguration_shared_by_every_engine_is_a_setup_error():
    with FakeWeightTransferEngine(not_configured=True) as a, \
            FakeWeightTransferEngine(not_configured=True) as b, make([a, b]) as sync, \
            pytest.raises(WeightSyncSetupError, match="no engine left"):
        sync.push(TinyNet(), 1)


def test_a_sync_with_an_on_version_of_its_own_is_refused(fakes):
    with pytest.raises(ValueError, match="on_version of its own"):
        FanOutWeightSync([VLLMWeightSync(fakes[0].url, "harness_gloo", on_version=print)])


def _qwen():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        tie_word_embeddings=True)).float()


def test_train_with_two_engines_moves_the_proxy_stamp_and_retires_a_failed_engine(tmp_path, fakes):
    urls = ",".join(f.url for f in fakes)
    with CaptureServer(urls) as proxy, CaptureClient(proxy.url, proxy.admin_key) as capture:
        links = weight_links(urls, "harness_gloo", capture)
        assert isinstance(links["weight_sync"], FanOutWeightSync)
        fakes[1].fail["/start_weight_update"] = (500, '{"error": {"message": "boom"}}')
        source = ReplaySource(lambda s, k: synthetic_trace(
            random.Random(10 * s + k), vocab=500, prompt_len=8, completion_len=4, tool_len=2),
            lambda s, k: float(k % 2))
        args = AsyncGRPOConfig(num_generations=2, max_steps=2, learning_rate=1e-3,
                               output_dir=str(tmp_path), report_to="none")
        try:
            HarnessAsyncGRPOTrainer(_qwen(), lambda sampling: source, args, **links).train()
        finally:
            links["weight_sync"].close()
        assert proxy.state.weight_version == 2
        assert fakes[0].weight_version == "2"
        described = {e["url"]: e["out"] for e in proxy.state.engines.describe()}
        assert described[fakes[0].url] is None and described[fakes[1].url].startswith("retired")


def test_a_retired_engine_reaches_a_rollout_services_proxy_through_the_service_pool(
        tmp_path, fakes):
    # The path harness.train takes: FanOutWeightSync -> ServicePool -> POST /v1/weight_version
    # on the service -> its capture proxy, which takes the engine out and then stamps.
    key = "fanout-test-key"
    service = start_service(",".join(f.url for f in fakes), tmp_path / "s", tasks="bundled",
                            key=key)
    pool = ServicePool([service.url], key)
    try:
        pool.set_weight_version(3, retired=[fakes[1].url])
        metrics = pool.client.get(f"{service.url}/metrics").json()
    finally:
        service.stop()
        pool.close()
    assert metrics["weight_version"] == 3
    assert [e["out"] is None for e in metrics["engines"]] == [True, False]
