"""What `harness.train` tells the capture proxy about weight versions, with and without a sync.

Run: .venv/bin/python -m pytest tests/test_train_weight_links.py -q

The proxy stamps each engine call with the version it was last told, and the trainer reads that
stamp as the truth for staleness and the IS correction. With --no-weight-sync the engine keeps
serving version 0, so the proxy must keep saying 0 however many steps the trainer takes.
"""

from __future__ import annotations

import random

import torch

from capture.client import CaptureClient
from capture.server import CaptureServer
from harness.train import weight_links
from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, synthetic_trace
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.weight_sync.fake_engine import FakeWeightTransferEngine


def _model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        tie_word_embeddings=True)).float()


def _train(links: dict, tmp_path, steps: int = 2) -> HarnessAsyncGRPOTrainer:
    source = ReplaySource(lambda s, k: synthetic_trace(random.Random(10 * s + k), vocab=500,
                                                       prompt_len=8, completion_len=4, tool_len=2),
                          lambda s, k: float(k % 2))
    args = AsyncGRPOConfig(num_generations=2, max_steps=steps, learning_rate=1e-3,
                           output_dir=str(tmp_path), report_to="none")
    trainer = HarnessAsyncGRPOTrainer(_model(), lambda sampling: source, args, **links)
    trainer.train()
    return trainer


def test_without_weight_sync_the_proxy_keeps_the_version_the_engine_serves(tmp_path) -> None:
    with CaptureServer("http://127.0.0.1:9") as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as capture:
        links = weight_links(proxy.url, None, capture)  # --no-weight-sync: no backend
        trainer = _train(links, tmp_path)
        assert trainer.state.policy_version == 2  # the trainer did move on...
        assert proxy.state.weight_version == 0  # ...but the engine still serves version 0


def test_with_weight_sync_the_proxy_hears_each_version_the_engine_confirmed(tmp_path) -> None:
    # The control for the test above: the same wiring with a sync does move the proxy.
    with FakeWeightTransferEngine() as engine, CaptureServer(engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as capture:
        links = weight_links(engine.url, "harness_gloo", capture)
        try:
            trainer = _train(links, tmp_path)
        finally:
            links["weight_sync"].close()
        assert trainer.state.policy_version == 2
        assert proxy.state.weight_version == 2
        assert engine.weight_version == "2"
