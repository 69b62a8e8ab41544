# nice -n 15 .venv/bin/python -m pytest tests/test_lora_engine.py -q -x
"""The proof for LoRA: adapters pushed hot from the trainer reach a running vLLM-CPU engine, exactly.

Modelled on tests/test_weight_sync_engine.py (the full-weight proof) and held to its tolerance:
one engine of its own, started by launchers.engine.Engine with `lora_rank=8` (so --enable-lora,
--max-lora-rank 8, --max-loras 2 and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1). The trainer holds the
tiny model with peft adapters (trainer.lora.build_lora_model), takes real optimizer steps on the
adapters, and pushes each version with LoRAWeightSync. The engine's logprobs for a fixed prompt
and completion, asked of adapter `tiny-lora-v<N>`, must equal the trainer's within 1e-3 and
differ from the base's by far more (so the test cannot pass with the adapter ignored).
Then the capture proxy, told (version, adapter), must send an agent's call to that adapter
whatever model name the agent asked for, and stamp it with that version.

Measured here (the first engine request also warms vLLM's CPU kernels): the adapter agrees with
the trainer to ~2e-6; a push of rank-8 adapters of the tiny model is ~0.15-0.3 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import torch

from launchers.engine import Engine
from tests.helpers.engine_equality import (
    PROMPT_IDS,
    TOLERANCE,
    engine_logprobs,
    train_step,
    trainer_logprobs,
)
from trainer.config import AsyncGRPOConfig
from trainer.distributed import DistInfo
from trainer.weight_sync import FullModelView, LoRAWeightSync

pytestmark = [pytest.mark.engine, pytest.mark.slow]

RANK = 8
@pytest.fixture(scope="module")
def lora_engine(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("lora-engine") / "vllm.log"
    with Engine(tiny_model_path, lora_rank=RANK, max_model_len=4096, log_path=log) as engine:
        yield engine


@pytest.fixture(scope="module")
def synced(lora_engine: Engine, tiny_model_path: Path,
           tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three adapter steps, each pushed; everything measured along the way."""
    from trainer.lora import build_lora_model

    args = AsyncGRPOConfig(lora_rank=RANK)
    single = DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"),
                      reason="test")
    model = build_lora_model(tiny_model_path, single, torch.float32, args)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    seen: list[tuple[int, str]] = []
    adapters = tmp_path_factory.mktemp("adapters")
    out: dict = {"seen": seen, "adapters": adapters, "push_s": [], "push_bytes": []}
    out["base"] = engine_logprobs(lora_engine.url, "tiny")
    out["trainer"] = [trainer_logprobs(model)]
    with LoRAWeightSync(lora_engine.url, adapters, base_name="tiny",
                        on_version=lambda v, name: seen.append((v, name))) as sync:
        for version in (1, 2, 3):
            train_step(model, optimizer)
            t0 = time.perf_counter()
            sync.push(FullModelView(model, torch.float32, trainable_only=True), version)
            out["push_s"].append(time.perf_counter() - t0)
            out["push_bytes"].append(sync.last_push_bytes)
            out["trainer"].append(trainer_logprobs(model))
            out[f"engine_v{version}"] = engine_logprobs(lora_engine.url, f"tiny-lora-v{version}")
        out["loaded"] = list(sync.loaded)
    out["models"] = [m["id"] for m in httpx.get(f"{lora_engine.url}/v1/models").json()["data"]]
    return out


def test_before_any_push_the_base_engine_and_the_adapter_model_agree(synced):
    # lora_B starts at zero: version 0 is the base, which the proxy then names
    assert (synced["base"] - synced["trainer"][0]).abs().max() < TOLERANCE


def test_after_a_step_and_a_push_the_adapter_logprobs_equal_the_trainer_logprobs(synced):
    for version in (1, 2, 3):
        diff = (synced[f"engine_v{version}"] - synced["trainer"][version]).abs().max()
        assert diff < TOLERANCE, f"adapter v{version}: engine and trainer differ by {diff:.2e}"


def test_the_pushed_adapter_changes_what_the_engine_computes(synced):
    # lr 1e-2 on rank-8 adapters moves these logprobs by far more than the tolerance: an engine
    # that ignored the adapter would answer with the base's numbers
    assert (synced["engine_v1"] - synced["base"]).abs().max() > 100 * TOLERANCE
    assert (synced["engine_v2"] - synced["engine_v1"]).abs().max() > 10 * TOLERANCE


def test_each_version_gets_its_own_adapter_name_and_old_ones_are_unloaded(synced, lora_engine):
    assert synced["seen"] == [(1, "tiny-lora-v1"), (2, "tiny-lora-v2"), (3, "tiny-lora-v3")]
    assert synced["loaded"] == [2, 3]  # keep_loaded=2: the current one and the one before
    assert "tiny-lora-v1" not in synced["models"]
    assert {"tiny", "tiny-lora-v2", "tiny-lora-v3"} <= set(synced["models"])
    gone = httpx.post(f"{lora_engine.url}/v1/completions", timeout=120,
                      json={"model": "tiny-lora-v1", "prompt": PROMPT_IDS, "max_tokens": 1})
    assert gone.status_code == 404
    # the adapter folders: peft layout, the three newest kept on disk (keep_files=3)
    assert sorted(p.name for p in synced["adapters"].iterdir()) == ["v1", "v2", "v3"]
    config = json.loads((synced["adapters"] / "v3" / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == 2 * RANK


def test_a_push_is_the_adapters_alone(synced):
    # 2 layers x 7 projections, A [8 x in] + B [out x 8], fp32: tens of KB, not the model's MB
    assert all(0 < b < 200_000 for b in synced["push_bytes"]), synced["push_bytes"]


def test_the_proxy_sends_every_call_to_the_current_adapter_and_stamps_its_version(
        synced, lora_engine):
    from capture import CaptureClient, CaptureServer

    messages = [{"role": "user", "content": "List the files."}]
    greedy = {"temperature": 0.0, "max_tokens": 8}
    with CaptureServer(lora_engine.url) as proxy, \
            CaptureClient(proxy.url, proxy.admin_key) as admin:
        admin.set_weight_version(3, "tiny-lora-v3")
        info = admin.create_session(sampling=greedy)
        reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=600,
                           headers={"authorization": f"Bearer {info.secret}"},
                           json={"model": "whatever-the-agent-says", "messages": messages})
        assert reply.status_code == 200, reply.text
        (turn,) = json.loads(admin.trace_json(info.session_id))["turns"]
    assert turn["metadata"]["weight_version_start"] == 3
    assert turn["metadata"]["engine_model"] == "tiny-lora-v3"
    direct = {}
    for model in ("tiny-lora-v3", "tiny"):
        direct[model] = httpx.post(f"{lora_engine.url}/v1/chat/completions", timeout=600, json={
            "model": model, "messages": messages, "temperature": 0.0, "max_tokens": 8,
            "logprobs": True, "top_logprobs": 0, "return_token_ids": True}).json()["choices"][0]
    adapter = direct["tiny-lora-v3"]
    assert turn["completion_token_ids"] == adapter["token_ids"]
    got = torch.tensor(turn["per_token_logps"])
    want = torch.tensor([e["logprob"] for e in adapter["logprobs"]["content"]])
    assert (got - want).abs().max() < TOLERANCE
    base = direct["tiny"]
    assert base["token_ids"] != adapter["token_ids"] or (got - torch.tensor(
        [e["logprob"] for e in base["logprobs"]["content"]])).abs().max() > 10 * TOLERANCE
