# .venv/bin/python -m pytest tests/test_lookup_model.py -q
"""The lookup family's starting model: committed, hashed, built from train pairs only, and it
reads the tool result.

What must hold without rebuilding it (minutes): it is what the main command resolves to for
mini-swe-agent on lookup:*, every file matches its BUILD.json sha256, the build record says it
saw the train instructions only, and, measured from the weights with nothing sampled (so the same
on every machine), on the dev instructions: its first step reads the file the instruction names
(`cat SOURCE` ranked first among the family's 4 sources), and after a `cat` whose result shows a
word it ranks that word above the others more than the model it was built from does. Each figure
is compared with the base model's, so a check that could not fail would show.

The copy is learnt fully and then used only part of the time on purpose (a noisy teacher's
last stage, harness/warm/lookup.py: the shown word in about a third of dev samples, the right
file in ~98%): using it is what RL has to learn. The bounds below are the measured figures with
a margin, not the probe's stored numbers.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.shared.lookup_names import VALUES
from harness.tasks.lookup import lookup_tasks, source_text
from harness.warm.agents import shared_prefix
from harness.warm.lookup import synthetic_vocabulary
from launchers.models import resolve_model
from launchers.tiny_model import COMMITTED_MODEL, TinyModelError
from launchers.warm_models import (
    AGENT_WARM_MODELS,
    AGENTS,
    LOOKUP_AGENTS,
    LOOKUP_MODEL,
    committed_lookup_model,
    lookup_model_dir,
    lookup_rebuild_command,
)
from tests.helpers.teacher_forced import (
    SharedHead,
    call_rank,
    claude_sandbox_prompt,
    encode_prompt,
    mini_first_request,
    opencode_first_request,
)

HARNESSES = ("mini-swe-agent", *LOOKUP_AGENTS)  # those with a lookup warm start committed


def _build(harness: str = "mini-swe-agent") -> dict:
    return json.loads((lookup_model_dir(harness) / "BUILD.json").read_text())


@pytest.mark.parametrize("harness", HARNESSES)
def test_the_main_commands_model_is_the_committed_lookup_warm_start_with_every_file_hashed(
        harness: str):
    directory = lookup_model_dir(harness)
    for name in (None, "mini-swe-agent") if harness == "mini-swe-agent" else (harness,):
        resolved = resolve_model(None, harness=name, tasks="lookup:train")
        assert resolved.path == directory and resolved.source == "tiny"
    build = _build(harness)
    on_disk = {p.name for p in directory.iterdir() if p.is_file() and p.name != "BUILD.json"}
    assert on_disk == set(build["files"]) and {"model.safetensors", "tokenizer.json"} <= on_disk
    assert build["built_by"] == lookup_rebuild_command(harness)
    assert build.get("harness", "mini-swe-agent") == harness
    assert (directory / "tokenizer.json").read_bytes() == (
        COMMITTED_MODEL / "tokenizer.json").read_bytes()


def test_an_agent_without_a_lookup_warm_start_keeps_its_create_file_one():
    for harness in sorted(set(AGENTS) - set(LOOKUP_AGENTS)):
        resolved = resolve_model(None, harness=harness, tasks="lookup:train")
        assert resolved.path == AGENT_WARM_MODELS[harness]
        with pytest.raises(ValueError, match="no lookup warm start"):
            committed_lookup_model(harness=harness)


@pytest.mark.parametrize("harness", HARNESSES)
def test_it_saw_one_rollout_per_train_instruction_and_was_probed_on_dev_not_test(harness: str):
    build = _build(harness)
    train_instructions = {t.metadata["instruction_id"] for t in lookup_tasks("train")}
    assert build["captured_rollouts"] == len(train_instructions)
    assert set(build["probe"]["after"]) == {"dev", "train"}  # test decides nothing


def _shell(harness: str, command: str) -> tuple[str, dict]:
    """The agent's shell tool and its arguments for `command`, as its build captured them
    (harness/audit/scripted_engine.py's shell_call: Claude Code's `Bash` takes a description)."""
    if harness == "claude-code":
        return "Bash", {"command": command, "description": "Run a command"}
    return "bash", {"command": command}


def _prompt(tok, harness: str, instruction: str, source: str | None, word: str = ""
            ) -> list[int]:
    """The agent's prompt ids: its recorded first request with `instruction`; with a `source`,
    the second: the `cat` call and the tool result as the agent sends it (mini-swe-agent: JSON
    with returncode and output; opencode and Claude Code: the output)."""
    if harness == "claude-code":
        from harness.audit.scripted_engine import tool_call

        call = None
        if source is not None:
            name, arguments = _shell(harness, f"cat {source}")
            call = tool_call(name, **arguments)
        return claude_sandbox_prompt(tok, instruction, call, source_text(word))
    mini = harness == "mini-swe-agent"
    messages, tools = (mini_first_request if mini else opencode_first_request)(instruction)
    if source is not None:
        name, arguments = _shell(harness, f"cat {source}")
        messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": name, "arguments": arguments}}]})
        output = source_text(word)
        messages.append({"role": "tool", "tool_call_id": "call_0", "content": json.dumps(
            {"returncode": 0, "output": output}, indent=2) if mini else output})
    return encode_prompt(tok, messages, tools)


def _dev_ranks(model_dir: Path, harness: str) -> tuple[list[int], list[int]]:
    """Per dev instruction: the rank of `cat SOURCE` among the 4 sources (first step); per
    (dev instruction, shown word): the rank of `echo W > TARGET` for the shown word among the
    family's 8 (second step, after the `cat` showed it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from harness.audit.scripted_engine import tool_call
    from harness.shared.lookup_names import SOURCES

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def call(command: str) -> list[int]:
        name, arguments = _shell(harness, command)
        return tok.encode(tool_call(name, **arguments), add_special_tokens=False)

    seen: dict[str, dict] = {}
    for task in lookup_tasks("dev"):
        seen.setdefault(task.metadata["instruction_id"], {**task.metadata,
                                                          "text": task.instruction.strip()})
    firsts, copies = [], []  # (prompt, candidate calls, index of the right one)
    for meta in sorted(seen.values(), key=lambda m: m["instruction_id"]):
        firsts.append((_prompt(tok, harness, meta["text"], None),
                       [call(f"cat {s}") for s in SOURCES], SOURCES.index(meta["source"])))
        writes = [call(f"echo {w} > {meta['target']}") for w in VALUES]
        copies.extend((_prompt(tok, harness, meta["text"], meta["source"], shown), writes,
                       VALUES.index(shown)) for shown in VALUES[::2])
    # The agent's system prompt and tools, run once (Claude Code's: ~15k tokens of ~17k).
    head = SharedHead(model, shared_prefix([p for p, _, _ in firsts + copies]))
    return ([call_rank(model, *scored, head=head) for scored in firsts],
            [call_rank(model, *scored, head=head) for scored in copies])


@pytest.mark.slow  # ~400 forwards past an agent's prompt head (1.4k to ~15k tokens), two models
@pytest.mark.parametrize("harness", HARNESSES)
def test_it_reads_the_named_file_and_ranks_the_shown_word_higher_than_its_base(harness: str):
    build = _build(harness)
    base = COMMITTED_MODEL if build["base"] == COMMITTED_MODEL.name else (
        LOOKUP_MODEL.parent / build["base"])
    (warm_first, warm_copy), (base_first, base_copy) = (
        _dev_ranks(lookup_model_dir(harness), harness), _dev_ranks(base, harness))
    top = lambda ranks: sum(r == 0 for r in ranks) / len(ranks)  # noqa: E731
    mean = lambda ranks: sum(ranks) / len(ranks)  # noqa: E731
    assert top(warm_first) >= 0.8 and top(base_first) <= 0.5, (warm_first, base_first)
    assert mean(warm_copy) < mean(base_copy), (warm_copy, base_copy)
    assert top(warm_copy) > top(base_copy), (warm_copy, base_copy)


def test_the_synthetic_vocabulary_holds_no_family_word_or_name():
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(LOOKUP_MODEL).get_vocab()
    words, names = synthetic_vocabulary(vocab, 0)
    assert (words, names) == synthetic_vocabulary(vocab, 0)  # seeded: the build is reproducible
    from harness.shared.lookup_names import SOURCES, TARGETS

    assert not set(words) & set(VALUES) and not set(names) & set(SOURCES + TARGETS)
    assert len(words) > 60 and len(names) > 60
    with pytest.raises(RuntimeError, match="need 120"):
        synthetic_vocabulary({"Ġhello": 1, "hello": 2}, 0)


def test_a_changed_file_of_the_lookup_model_is_refused_by_name(tmp_path: Path):
    copy = tmp_path / "warm"
    shutil.copytree(LOOKUP_MODEL, copy)
    assert committed_lookup_model(copy) == copy
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")
    with pytest.raises(TinyModelError, match="model.safetensors"):
        committed_lookup_model(copy)


def test_the_build_takes_the_cat_and_echo_turns_among_an_agents_other_calls():
    # opencode asks the model for a conversation title before its first step: the build must
    # rebuild its rows from the `cat` and `echo` turns, wherever they are in the trace.
    from transformers import AutoTokenizer

    from harness.audit.scripted_engine import tool_call
    from harness.warm.lookup import _Turns

    tok = AutoTokenizer.from_pretrained(LOOKUP_MODEL)
    task = lookup_tasks("train")[0]
    m = task.metadata
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    p1 = f"<|im_start|>user\n{task.instruction.strip()}<|im_end|>\n<|im_start|>assistant\n"
    c1 = tool_call("bash", command=f"cat {m['source']}")
    p2 = (p1 + c1 + "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
          + source_text(m["value"]) + "\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    c2 = tool_call("bash", command=f"echo {m['value']} > {m['target']}")
    title = {"prompt_token_ids": enc("<|im_start|>user\nA title?<|im_end|>\n<|im_start|>"
                                     "assistant\n"), "completion_token_ids": enc("Notes<|im_end|>")}
    turns = [title, {"prompt_token_ids": enc(p1), "completion_token_ids": enc(c1 + "<|im_end|>")},
             {"prompt_token_ids": enc(p2), "completion_token_ids": enc(c2 + "<|im_end|>")}]
    record = {"task_id": task.full_name, "trace": {"turns": turns}}
    captured = _Turns(tok, [record]).captured[0]
    assert f"cat {m['source']}" in captured["c1"] and captured["p1"] == p1
    assert f"echo {m['value']} > {m['target']}" in captured["c2"]
    assert source_text(m["value"]) in captured["tail"]
    record["trace"]["turns"] = turns[:2]  # no second step: nothing to teach it from
    with pytest.raises(RuntimeError, match="no captured turn holds 'echo"):
        _Turns(tok, [record])


def test_a_calls_score_against_the_cached_prompt_is_its_whole_sequence_score():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests.helpers.teacher_forced import call_scores

    tok = AutoTokenizer.from_pretrained(LOOKUP_MODEL)
    model = AutoModelForCausalLM.from_pretrained(LOOKUP_MODEL, dtype=torch.float32).eval()
    prompt = tok.encode("<|im_start|>user\nRead data.txt<|im_end|>\n<|im_start|>assistant\n",
                        add_special_tokens=False)
    calls = [tok.encode(t, add_special_tokens=False) for t in ("cat data.txt", "ls", "echo a")]
    with torch.no_grad():
        dense = []
        for c in calls:
            logp = torch.log_softmax(model(torch.tensor([prompt + c])).logits[0].float(), -1)
            dense.append(logp[len(prompt) - 1:-1].gather(1, torch.tensor(c)[:, None]).sum().item())
    assert call_scores(model, prompt, calls) == pytest.approx(dense, abs=1e-4)
    head = SharedHead(model, prompt[:5])  # the same prompt past a head run once
    assert call_scores(model, prompt, calls, head) == pytest.approx(dense, abs=1e-4)
    with pytest.raises(ValueError, match="does not extend"):
        call_scores(model, prompt[:5], calls, head)


def test_the_build_probe_reads_the_command_of_every_agents_shell_call():
    # Claude Code's `Bash` call carries a description after the command: a probe that matched
    # only calls ending on the command read every Claude Code sample as wrong (0%, silently).
    from harness.audit.scripted_engine import tool_call
    from harness.warm.lookup import _shell_command

    calls = {tool_call("Bash", command="cat notes.txt", description="Run a command"):
             "cat notes.txt",
             tool_call("bash", command="echo amber > out.txt") + "<|im_end|>":
             "echo amber > out.txt",
             tool_call("exec_command", cmd="cat a\\ b.txt"): "cat a\\ b.txt",
             "I will read it. " + tool_call("bash", command=" cat x.txt "): "cat x.txt"}
    for reply, command in calls.items():
        assert _shell_command(reply) == command, reply
    for reply in ("cat notes.txt", "<tool_call>\n{not json}\n</tool_call>",
                  '<tool_call>\n{"name": "bash", "arguments": "cat x"}\n</tool_call>',
                  tool_call("Read", file_path="notes.txt")):
        assert _shell_command(reply) is None, reply
