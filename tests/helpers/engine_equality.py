"""The fixed prompt and completion on which an engine and a trainer must agree after a push.

Shared by the full-weight proof (tests/test_weight_sync_engine.py) and the LoRA proof
(tests/test_lora_engine.py): both score the same tokens with `prompt_logprobs` (nothing sampled,
so the figure is the same on every machine), hold them to one tolerance, and move the weights
with an SFT step standing in for GRPO's.
"""

from __future__ import annotations

import httpx
import torch

TOLERANCE = 1e-3  # absolute, per token logprob
PROMPT_IDS = [17, 305, 1022, 88, 2301, 45, 999, 1500, 12, 777, 3001, 64]
COMPLETION_IDS = [402, 1203, 56, 2048, 9, 811, 3333, 140]


def engine_logprobs(url: str, model: str = "tiny", timeout: float = 600) -> torch.Tensor:
    """The engine's logprob of each completion token under `model` (the served name or an
    adapter's), given everything before it. [C]"""
    ids = PROMPT_IDS + COMPLETION_IDS
    response = httpx.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": ids, "max_tokens": 1, "prompt_logprobs": 0},
        timeout=timeout,
    )
    response.raise_for_status()
    per_position = response.json()["choices"][0]["prompt_logprobs"]  # [P + C], first is None
    return torch.tensor([per_position[len(PROMPT_IDS) + i][str(tok)]["logprob"]
                         for i, tok in enumerate(COMPLETION_IDS)])


def trainer_logprobs(model: torch.nn.Module) -> torch.Tensor:
    """The same quantity from the trainer's model. [C]"""
    ids = torch.tensor([PROMPT_IDS + COMPLETION_IDS])  # [1, P + C]
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT_IDS) - 1 : -1].float()  # [C, V]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(COMPLETION_IDS)[:, None])[:, 0]


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """One optimizer step raising the completion's likelihood (an SFT step stands in for
    GRPO's): whatever parameters the optimizer holds move, the full model's or the adapters'."""
    ids = torch.tensor([PROMPT_IDS + COMPLETION_IDS])
    logits = model(ids).logits[0, len(PROMPT_IDS) - 1 : -1]  # [C, V]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(COMPLETION_IDS))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
