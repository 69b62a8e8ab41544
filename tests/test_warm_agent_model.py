# .venv/bin/python -m pytest tests/test_warm_agent_model.py -q
"""The agents' own warm starts (harness/warm/agents.py).

What must hold without rebuilding them (a few minutes each): `--harness codex` / `opencode` /
`claude-code` start from their own committed build and mini-swe-agent from the default; every
file matches its BUILD.json; each saw the train instances only through its own agent and left
RL room on the held-out ones. And the shortcut the build takes, a shared prompt prefix computed
once, must give exactly the loss of a whole-sequence forward: a wrong offset there would train
the model on the wrong tokens and nothing would fail.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.tasks.family import family_tasks
from harness.warm.agents import PrefixSFT, shared_prefix
from harness.warm.create_file import completion_loss, round_trip_text
from launchers.models import resolve_model
from launchers.tiny_model import COMMITTED_MODEL, TinyModelError
from launchers.warm_models import (
    AGENT_WARM_MODELS,
    WARM_MODEL,
    committed_agent_warm_model,
    rebuild_command,
)


@pytest.mark.parametrize("harness", sorted(AGENT_WARM_MODELS))
def test_the_agent_starts_from_its_own_committed_warm_start(harness: str) -> None:
    directory = AGENT_WARM_MODELS[harness]
    resolved = resolve_model(None, harness=harness)
    assert resolved.path == directory and resolved.source == "tiny"
    build = json.loads((directory / "BUILD.json").read_text())
    on_disk = {p.name for p in directory.iterdir() if p.is_file() and p.name != "BUILD.json"}
    assert on_disk == set(build["files"]) and {"model.safetensors", "tokenizer.json"} <= on_disk
    assert build["built_by"] == rebuild_command(harness) and build["harness"] == harness
    assert build["base"] == WARM_MODEL.name  # it starts from the default, which already reads
    # The same tokenizer all along: the engine, the proxy's ids and the trainer agree.
    assert (directory / "tokenizer.json").read_bytes() == (
        COMMITTED_MODEL / "tokenizer.json").read_bytes()
    assert build["captured_rollouts"] == len(family_tasks("train"))
    probe = build["first_turn_probe"]
    # Before: the default model answers this agent's prompt with no well-formed call.
    assert probe["before"]["heldout"]["pass"] == 0.0
    after = probe["after"]
    assert after["heldout"]["formed"] >= 0.8, after  # it calls the agent's own shell tool
    assert 0.1 <= after["heldout"]["pass"] <= 0.7, after  # room for RL, read not memorised
    assert max(after["heldout"]["word"], after["heldout"]["file"]) >= 0.4, after


@pytest.mark.parametrize("harness", [None, "mini-swe-agent"])
def test_the_other_agents_start_from_the_default(harness: str | None) -> None:
    assert resolve_model(None, harness=harness).path == WARM_MODEL


def test_a_changed_file_of_an_agent_warm_start_is_refused_by_name(tmp_path: Path) -> None:
    copy = tmp_path / "warm"
    shutil.copytree(AGENT_WARM_MODELS["codex"], copy)
    assert committed_agent_warm_model("codex", copy) == copy
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[0] ^= 1
    weights.write_bytes(bytes(data))
    with pytest.raises(TinyModelError, match="model.safetensors does not match.*--harness codex"):
        committed_agent_warm_model("codex", copy)
    with pytest.raises(ValueError, match="no agent warm start for 'mini-swe-agent'"):
        committed_agent_warm_model("mini-swe-agent")


def _rows(prefix: list[int], rng: random.Random) -> list[tuple[list[int], list[int]]]:
    return [(prefix + [rng.randrange(4000) for _ in range(rng.randrange(1, 12))],
             [rng.randrange(4000) for _ in range(rng.randrange(1, 9))]) for _ in range(4)]


def test_the_shared_prefix_loss_is_the_whole_sequence_loss() -> None:
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(WARM_MODEL, dtype=torch.float32)
    rng = random.Random(0)
    prefix = [rng.randrange(4000) for _ in range(300)]
    rows = _rows(prefix, rng)
    cached = PrefixSFT(model, prefix, eos=4087)
    cached.refresh()
    total, count = 0.0, 0
    for prompt, completion in rows:
        ids = torch.tensor([prompt + completion])
        labels = torch.full_like(ids, -100)
        labels[0, len(prompt):] = torch.tensor(completion)
        with torch.no_grad():
            total += model(input_ids=ids, labels=labels).loss.item() * len(completion)
        count += len(completion)
    assert cached.loss(rows).item() == pytest.approx(total / count, rel=1e-5)
    # The padded batch the bare stage trains on is the same mean.
    with torch.no_grad():
        assert completion_loss(model, rows, pad=4088).item() == pytest.approx(total / count,
                                                                              rel=1e-5)
    # Off by one token (the completion scored from its own first token) is a different number.
    shifted = [(p + c[:1], c[1:]) for p, c in rows if len(c) > 1]
    assert cached.loss(shifted).item() != pytest.approx(total / count, rel=1e-3)
    # The loss trains: its gradient reaches the weights.
    cached.loss(rows).backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0


def test_a_row_off_the_prefix_is_refused_and_sampling_stops_at_eos() -> None:
    model = AutoModelForCausalLM.from_pretrained(WARM_MODEL, dtype=torch.float32)
    prefix = list(range(10, 60))
    cached = PrefixSFT(model, prefix, eos=4087)
    cached.refresh()
    with pytest.raises(ValueError, match="does not extend the shared prefix"):
        cached.loss([([1, 2, 3] + prefix, [5])])
    with pytest.raises(ValueError, match="does not extend the shared prefix"):
        cached.loss([(prefix, [5])])  # nothing after the prefix to predict from
    for reply in cached.sample(prefix + [70], 3, max_new=6):
        assert 1 <= len(reply) <= 6 and 4087 not in reply[:-1]


def test_shared_prefix() -> None:
    assert shared_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3]]) == [1, 2]
    assert shared_prefix([[1, 2], [1, 2, 3]]) == [1, 2]
    assert shared_prefix([[7], [8]]) == []


def test_a_captured_turn_that_does_not_round_trip_is_refused() -> None:
    """A prompt rebuilt from text must be the ids the engine saw: "hello" spelt as single
    letters decodes to text that encodes to other ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(WARM_MODEL)
    ids = tok.encode(" hello world", add_special_tokens=False)
    assert round_trip_text(tok, ids) == " hello world"
    letters = [tok.convert_tokens_to_ids(c) for c in "hello"]
    assert tok.encode("hello", add_special_tokens=False) != letters
    with pytest.raises(RuntimeError, match="does not round-trip"):
        round_trip_text(tok, letters)
