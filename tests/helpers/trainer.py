"""Builders for the trainer tests: seeded tiny models, a one-step trainer, a replay source.

Many trainer test modules (and the scripts they run on torchrun ranks or in killed processes)
need the same seeded model and the same synthetic rollouts, so that a pinned number means the
same thing in each. They used to import these from test_trainer_step.py; a test module that
imports another's privates breaks when that module is renamed or its helper changes for its own
tests' sake (tests/test_test_layout.py forbids it now).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from trainer.config import AsyncGRPOConfig
from trainer.fakes import ReplaySource, synthetic_trace
from trainer.grpo import HarnessAsyncGRPOTrainer
from trainer.packing import MicroBatch

__all__ = ["make_trainer", "prefix_tiny_model", "random_microbatch", "replay_source",
           "seeded_tiny_model", "small_qwen3"]


def seeded_tiny_model() -> torch.nn.Module:
    """The tiny model's architecture with weights from torch.manual_seed(0): a pinned value
    must not move when launchers/tiny_model.py changes how it builds or warms its weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=512, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      head_dim=32, max_position_embeddings=1024, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).float()


def prefix_tiny_model(vocab: int = 512) -> torch.nn.Module:
    """A seeded tiny model with grouped-query attention (4 query heads over 2 kv heads) and a
    2048-token window: the prefix-sharing tests need the kv-head sharing and long packed rows."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).float()


def small_qwen3(layers: int = 2, vocab: int = 1000, hidden: int = 128,
                inter: int = 384) -> torch.nn.Module:
    """A seeded Qwen3 of any small size (4 query heads over 2 kv heads): the memory tests
    measure how saved activations scale with layers, width and vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=hidden // 4, tie_word_embeddings=True)
    return Qwen3ForCausalLM(cfg).float()


def random_microbatch(n: int, vocab: int, seed: int = 0) -> MicroBatch:
    """One row of `n` seeded random tokens, every target trained, zero advantages."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (1, n), generator=g)
    idx = torch.arange(n - 1)
    return MicroBatch(input_ids=ids, position_ids=torch.arange(n)[None], logit_index=idx,
                      target_ids=ids[0, 1:], behaviour_logprobs=torch.zeros(n - 1),
                      advantages=torch.zeros(n - 1), token_weight=torch.ones(n - 1), n_rows=1,
                      n_tokens=n)


def make_trainer(model: torch.nn.Module, tmp_path: Path, source: ReplaySource | None = None,
                 **cfg: object) -> HarnessAsyncGRPOTrainer:
    """A trainer of one step (two generations, lr 1e-2, no reporting) unless `cfg` says more;
    its source produces nothing unless one is given (tests that call run_step feed rows)."""
    args = AsyncGRPOConfig(**{"num_generations": 2, "max_steps": 1, "learning_rate": 1e-2,
                              "output_dir": str(tmp_path), "report_to": "none", **cfg})
    source = source or ReplaySource(lambda s, k: None, lambda s, k: None)
    return HarnessAsyncGRPOTrainer(model, lambda sampling: source, args)


def replay_source(vocab: int = 500) -> ReplaySource:
    """Synthetic traces seeded by (seed, k), rewarded k % 2: every group has variance."""
    return ReplaySource(
        lambda s, k: synthetic_trace(random.Random(100 * s + k), vocab=vocab, prompt_len=12,
                                     completion_len=6, tool_len=4),
        lambda s, k: float(k % 2))
