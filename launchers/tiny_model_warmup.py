"""Supervised warm-up that teaches the tiny model the shape of an agent turn, on agent-sized prompts.

Why: a randomly initialised model never emits `<|im_end|>` or a `<tool_call>`. Every agent call
then runs to its max_tokens cap, agents never run a tool, every reward is 0, every GRPO group has
zero variance and nothing trains: the plumbing would be exercised only in its least interesting
path. After this warm-up the model answers a first turn with one hermes tool call to `bash`
(`{"name": "bash", "arguments": {"command": ...}}`) and, after a tool result, mostly ends with a
short text. Its commands are drawn from a tiny vocabulary of file names and words that the bundled
tasks also use, so a task like "create hello.txt containing hello" succeeds by chance a few
percent of the time: rewards vary within a group, and RL has something to learn.

Why always `bash`: the agents' shell tools are `bash` (opencode, mini-swe-agent), `Bash` (Claude
Code) and `exec_command` (Codex). Taught to copy the shell tool's name out of the tools block, a
2-layer, 64-wide model did not learn it in 300-500 steps (it mixed the names: `bashash`), and a
mixed name is no tool at all. One fixed name is a tool call every agent keeps in its history:
opencode and mini-swe-agent run it; Claude Code and Codex answer it with a tool error, which is a
tool result all the same, so the agent's next call extends the last one (what the capture's
rollout graph chains).

Why long, prose-heavy prompts: real agents send 1-18k tokens of system prompt and tool schemas.
Trained on a few hundred tokens of filler, the model answered opencode's, Claude Code's and
Codex's real first prompts with no well-formed call at all (measured on those prompts, captured
from the agents). The prompts here carry tools with long descriptions and system text drawn from
the tokenizer's corpus, with shell-tool names mentioned in passing.

What it is not: a capable model. It does not read the instruction; it only knows the format.
Deterministic from the seed on a given torch build; the result is cached with the model
(launchers/tiny_model.py).
"""

from __future__ import annotations

import random

import torch

__all__ = ["SHELL_TOOLS", "warm_up"]

SHELL_TOOLS = ("bash",)
OTHER_TOOL_NAMES = ["read", "write", "edit", "glob", "grep", "todowrite", "webfetch", "task", "skill",
                    "Read", "Write", "Edit", "Glob", "Grep", "Task", "TodoWrite", "WebFetch", "WebSearch",
                    "NotebookEdit", "Agent", "ToolSearch", "Skill", "write_stdin", "apply_patch",
                    "update_plan", "view_image", "spawn_agent", "send_input", "list_files", "search"]
FILES = ["hello.txt", "answer.txt", "notes.txt", "out.txt"]
WORDS = ["hello", "world", "done", "42"]
FILLER = [
    "You are a coding agent running in a sandbox.", "Use the tools to inspect and change files.",
    "Keep answers short.", "Run commands to verify your work.", "The working directory is /app.",
    "Prefer small, safe edits.", "Never ask the user questions; finish the task.",
    "When the task is done, reply with a one-line summary.", "Files live under the workdir.",
]
# Shell-tool names as agents' prompts mention them in passing.
MENTIONS = ["Use the Bash tool to run commands.", "Run shell commands with care.",
            "The bash shell is available.", "exec_command runs a command in a PTY.",
            "Prefer the shell over scripts.", "Do not use Bash for file reads.",
            "Commands run in bash; the shell state does not persist.", "<shell>bash</shell>"]


def _prose(rng: random.Random, lines: list[str], n: int) -> str:
    out = []
    for _ in range(n):
        draw = rng.random()
        if draw < 0.15:
            out.append(rng.choice(MENTIONS))
        elif draw < 0.5 and lines:
            out.append(rng.choice(lines))
        else:
            out.append(rng.choice(FILLER))
    return rng.choice([" ", "\n", "\n- "]).join(out)


def _tool(rng: random.Random, lines: list[str], name: str, param: str, long: bool) -> dict:
    props = {param: {"type": "string", "description": _prose(rng, lines, rng.randint(1, 3))}}
    for extra in rng.sample(["timeout", "description", "workdir", "path", "limit"], rng.randint(0, 3)):
        props[extra] = {"type": rng.choice(["string", "number", "boolean"]),
                        "description": _prose(rng, lines, 1)}
    return {"type": "function", "function": {
        "name": name, "description": _prose(rng, lines, rng.randint(3, 25) if long else rng.randint(1, 6)),
        "parameters": {"type": "object", "properties": props, "required": [param]}}}


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


def _example(rng: random.Random, tokenizer, lines: list[str], long: bool = False
             ) -> tuple[list[int], list[int]]:
    """One rendered conversation and its loss mask (1 on assistant tokens, their <|im_end|> too).

    `long` examples carry a system prompt and tool block of 1-12k tokens, like real agents send.
    """
    shell = rng.choice(SHELL_TOOLS)  # one name; drawn all the same, as the cached model's build did
    others = rng.sample(OTHER_TOOL_NAMES, rng.randint(2, 14) if long else rng.randint(0, 6))
    tools = [_tool(rng, lines, n, rng.choice(["path", "pattern", "content", "query"]), long)
             for n in others]
    tools.insert(rng.randint(0, len(tools)), _tool(rng, lines, shell, "command", long))
    system = _prose(rng, lines, rng.randint(20, 700) if long else rng.randint(1, 15))
    user = f"Create {rng.choice(FILES)} containing {rng.choice(WORDS)}."
    messages = [{"role": "system", "content": system}]
    if rng.random() < 0.3:  # agents often send their environment as a user turn first
        messages.append({"role": "user", "content": _prose(rng, lines, rng.randint(1, 30) if long else 3)})
    messages += [{"role": "user", "content": user},
                 {"role": "assistant", "content": "", "tool_calls": [_call(shell, _command(rng))]},
                 {"role": "tool", "tool_call_id": "call_0",
                  "content": rng.choice(["", "ok", "a.txt\nb.txt", "hello", "Error: no such file"])}]
    if rng.random() < 0.8:
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


def warm_up(model, tokenizer, seed: int, steps: int, lines: list[str], batch_size: int = 8,
            lr: float = 5e-3, log_every: int = 0) -> float:
    """Train `model` in place on synthetic agent turns (`lines`: prose for prompts); returns the
    last loss."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    pool = [_example(rng, tokenizer, lines) for _ in range(256)]
    long_pool = [_example(rng, tokenizer, lines, long=True) for _ in range(48)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    pad = tokenizer.pad_token_id
    model.train()
    loss = torch.tensor(0.0)
    for step in range(steps):
        # Every 4th step is one long conversation alone, so short batches are not padded to it.
        if step % 4 == 3:
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
