"""A few hundred steps of supervised warm-up that teach the tiny model the shape of an agent turn.

Why: a randomly initialised model never emits `<|im_end|>` or a `<tool_call>`. Every agent call
then runs to its max_tokens cap, agents never run a tool, every reward is 0, every GRPO group has
zero variance and nothing trains: the plumbing would be exercised only in its least interesting
path. After this warm-up the model answers a first turn with a hermes tool call running a shell
command (`{"name": <the shell tool>, "arguments": {"command": ...}}`) and, after a tool result,
mostly ends with a short text. Its commands are drawn from a tiny vocabulary of file names and
words that the bundled tasks also use, so a task like "create hello.txt containing hello" succeeds
by chance a few percent of the time: rewards vary within a group, and RL has something to learn.

What it is not: a capable model. It does not read the instruction (a 2-layer, 64-wide model has no
room for that after a few seconds of training); it only knows the format. Deterministic from the
seed on a given torch build; the result is cached with the model (launchers/tiny_model.py).
"""

from __future__ import annotations

import random

import torch

__all__ = ["SHELL_TOOL_NAMES", "warm_up"]

SHELL_TOOL_NAMES = ["bash", "Bash", "shell", "exec_command"]
OTHER_TOOL_NAMES = ["read", "write", "edit", "glob", "grep", "todowrite", "webfetch", "task"]
FILES = ["hello.txt", "answer.txt", "notes.txt", "out.txt"]
WORDS = ["hello", "world", "done", "42"]
FILLER = [
    "You are a coding agent running in a sandbox.", "Use the tools to inspect and change files.",
    "Keep answers short.", "Run commands to verify your work.", "The working directory is /app.",
    "Prefer small, safe edits.", "Never ask the user questions; finish the task.",
    "When the task is done, reply with a one-line summary.", "Files live under the workdir.",
]


def _tool(name: str) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": f"The {name} tool.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}}


def _command(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.6:
        return f"echo {rng.choice(WORDS)} > {rng.choice(FILES)}"
    if kind < 0.8:
        return f"cat {rng.choice(FILES)}"
    return rng.choice(["ls", "pwd", "ls -la", "python3 -m pytest -q"])


def _call(name: str, command: str) -> dict:
    return {"id": "call_0", "type": "function",
            "function": {"name": name, "arguments": {"command": command}}}


def _example(rng: random.Random, tokenizer, long: bool = False) -> tuple[list[int], list[int]]:
    """One rendered conversation and its loss mask (1 on assistant tokens, their <|im_end|> too).

    `long` examples carry a system prompt of several thousand tokens, like real agents send
    (opencode's is ~9.5k characters): trained only on short prompts, the model answered every
    8k-token prompt with a bare `</tool_call><|im_end|>` (measured on seed 0).
    """
    shell = rng.choice(SHELL_TOOL_NAMES)
    names = [shell, *rng.sample(OTHER_TOOL_NAMES, rng.randint(0, 5))]
    rng.shuffle(names)
    tools = [_tool(n) for n in names]
    sentences = rng.randint(150, 450) if long else rng.randint(1, 15)
    system = " ".join(rng.choice(FILLER) for _ in range(sentences))
    user = f"Create {rng.choice(FILES)} containing {rng.choice(WORDS)}."
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user},
                {"role": "assistant", "content": "", "tool_calls": [_call(shell, _command(rng))]},
                {"role": "tool", "tool_call_id": "call_0", "content": rng.choice(["", "ok", "a.txt\nb.txt"])}]
    if rng.random() < 0.7:
        messages.append({"role": "assistant", "content": rng.choice(["Done.", "Done, the file is written.", "Finished."])})
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [_call(shell, _command(rng))]})
    ids: list[int] = []
    mask: list[int] = []
    # Render growing prefixes so each assistant turn's tokens are exactly the template's.
    for end in range(1, len(messages) + 1):
        if messages[end - 1]["role"] != "assistant":
            continue
        context = tokenizer.apply_chat_template(messages[:end - 1], tools=tools, add_generation_prompt=True,
                                                return_dict=False)
        full = tokenizer.apply_chat_template(messages[:end], tools=tools, return_dict=False)
        full = full[:-1] if tokenizer.decode(full[-1:]) == "\n" else full  # stop at <|im_end|>
        new_context = context[len(ids):]
        ids += new_context + full[len(context):]
        mask += [0] * len(new_context) + [1] * (len(full) - len(context))
    return ids, mask


def warm_up(model, tokenizer, seed: int, steps: int, batch_size: int = 8, lr: float = 5e-3,
            log_every: int = 0) -> float:
    """Train `model` in place on synthetic agent turns; returns the last loss."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    pool = [_example(rng, tokenizer) for _ in range(128)]
    long_pool = [_example(rng, tokenizer, long=True) for _ in range(16)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    pad = tokenizer.pad_token_id
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        # Every 5th step is one long conversation alone, so short batches are not padded to it.
        if step % 5 == 4:
            batch = [long_pool[rng.randrange(len(long_pool))]]
        else:
            batch = [pool[rng.randrange(len(pool))] for _ in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        rows = len(batch)
        input_ids = torch.full((rows, width), pad)                       # [B, T]
        labels = torch.full((rows, width), -100)                         # [B, T]
        attention = torch.zeros((rows, width), dtype=torch.long)         # [B, T]
        for row, (ids, mask) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention[row, : len(ids)] = 1
            labels[row, : len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask, strict=True)])
        # Project to the vocabulary only where the loss is taken: the 4k-wide output layer dominates
        # the cost, and ~90% of positions are context.
        hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state  # [B, T, H]
        targets = labels[:, 1:]                                           # [B, T-1]
        selected = targets != -100                                        # [B, T-1]
        logits = model.lm_head(hidden[:, :-1][selected])                  # [N, V]
        loss = torch.nn.functional.cross_entropy(logits, targets[selected])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        if log_every and step % log_every == 0:
            print(f"warm-up step {step}/{steps} loss {loss.item():.3f}", flush=True)
    model.eval()
    return loss.item()
