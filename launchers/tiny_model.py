"""The tiny default model: built locally from a seed, never downloaded.

Why it exists: no model can be downloaded on the machines Harness is developed and tested on, yet
every room needs a real model that vLLM serves (with tool calls, token ids and logprobs) and that
transformers trains. So we build one: Qwen3 architecture (2 layers, hidden 64, head_dim 32 — vLLM's
CPU attention rejects head_dim 16 at the first request, DESIGN.md section 5), a byte-level BPE
tokenizer trained here on a fixed corpus, and a ChatML chat template with real tool-call support in
the format of vLLM's `hermes` parser (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`), so
the agents' tool loops and the engine's parser are exercised for real. max length 32k: real agent
prompts run to several thousand tokens.

Weights: random from the seed, then supervised warm-up on synthetic agent turns with agent-sized
prompts (launchers/tiny_model_warmup.py; ~17 min on this 2-core machine, once) so that it answers in
the agent format: a hermes `bash` tool call, then a short text ending in <|im_end|>. Without it
every call runs to its token cap and every reward is 0.

The default model (seed 0, the full warm-up) is committed to the repo under `models/tiny-qwen3/`
(~2 MB), with a BUILD.json that records how it was built and the sha256 of every file, checked
each time it is used. Why commit it: the warm-up costs ~17 min on 2 cores, and a rebuild is the
same only on the same torch build and stdlib corpus, so the model every machine serves, tests and
trains would differ from machine to machine (a test that passes on one machine's greedy answers
can fail on another's). Committed, it is byte for byte the same everywhere and set-up skips the
build. Other seeds or warm-up lengths are still built here and cached under
`<cache>/models/tiny-qwen3-<key>`; a rebuild from the same seed on the same torch build gives the
same weights (tests/test_foundation_model.py). What it does not do: understand anything. It knows
the format, not the task, so it fails most tasks; the plumbing around it is what is being tested.

Run `python -m launchers.tiny_model` to find (or build) it and print its path;
`python -m launchers.tiny_model --commit` rebuilds the default and writes it to `models/tiny-qwen3/`
(after a change that bumps BUILDER_VERSION).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path

from launchers.paths import REPO_ROOT, cache_dir

__all__ = ["TINY_MODEL_NAME", "CHAT_TEMPLATE", "COMMITTED_MODEL", "TinyModelError", "build_tiny_model",
           "check_build_hashes", "commit_tiny_model", "committed_tiny_model", "tiny_model_config"]

TINY_MODEL_NAME = "tiny"
BUILDER_VERSION = 5  # bump when anything below changes what gets built
VOCAB_SIZE = 4096
MAX_LENGTH = 32768
WARMUP_STEPS = 1000  # ~17 min on this 2-core machine, once; the result is cached
DEFAULT_SEED = 0
COMMITTED_MODEL = REPO_ROOT / "models" / "tiny-qwen3"
_MANIFEST = "BUILD.json"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not "special": they must survive decoding, because vLLM's hermes tool parser and the
# reasoning parsers look for them in the generated text.
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

# Stdlib modules whose source makes the tokenizer corpus: code, English docstrings and JSON-ish text,
# like what coding agents send. Fixed list, so the corpus is the same on every machine with the same
# Python.
_CORPUS_MODULES = ["json/__init__.py", "json/decoder.py", "argparse.py", "subprocess.py", "pathlib.py",
                   "shutil.py", "textwrap.py", "difflib.py", "unittest/case.py", "logging/__init__.py"]

# ChatML with hermes tool calls. Tools are rendered into the system turn; tool results are grouped
# into one user turn of <tool_response> blocks, the way Qwen-family templates do it. Content may be a
# string or a list of OpenAI content parts; only text parts are rendered.
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable -%}{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    # System turn, with the tool signatures when there are tools.
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' -%}{{ text(messages[0].content) + '\\n\\n' }}{%- endif -%}"
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools -%}{{ '\\n' + (tool | tojson) }}{%- endfor -%}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments'"
    " ' within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages and messages[0].role == 'system' -%}"
    "{{ '<|im_start|>system\\n' + text(messages[0].content) + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    # The conversation.
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' and loop.first -%}"
    "{%- elif message.role == 'user' or message.role == 'system' -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + text(message.content) + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content -%}"
    "{{ '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif -%}"
    "{{ text(message.content) }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if not loop.first or text(message.content) -%}{{ '\\n' }}{%- endif -%}"
    "{{ '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' }}"
    "{%- if fn.arguments is string -%}{{ fn.arguments }}{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user' }}{%- endif -%}"
    "{{ '\\n<tool_response>\\n' + text(message.content) + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def tiny_model_config(vocab_size: int) -> dict:
    """The Qwen3 config of the tiny model (plain dict, so the cache key can hash it)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LENGTH,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "torch_dtype": "float32",
    }


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for relative in _CORPUS_MODULES:
        path = stdlib / relative
        if path.exists():
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
    # Tool-call and chat markup, so common agent JSON becomes short token runs.
    texts.append('{"name": "bash", "arguments": {"command": "ls -la"}}\n' * 50)
    texts.append('{"type": "function", "function": {"name": "read", "description": "Read a file", '
                 '"parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}\n' * 50)
    return texts


def _prose_lines() -> list[str]:
    """Lines of the corpus's own text (no comments, no imports), for the warm-up's prompts."""
    lines = []
    for text in _corpus()[:-2]:  # not the two synthetic JSON texts
        for line in text.splitlines():
            line = line.strip()
            if 20 < len(line) < 120 and not line.startswith(("#", "import", "from")):
                lines.append(line)
    return lines


def _cache_key(seed: int, warmup_steps: int) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps({"v": BUILDER_VERSION, "seed": seed, "vocab": VOCAB_SIZE,
                              "template": CHAT_TEMPLATE, "warmup": warmup_steps}).encode())
    for text in _corpus():
        digest.update(text.encode())
    return digest.hexdigest()[:12]


def _train_tokenizer(out: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS) - len(MARKUP_TOKENS),
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    fast.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    fast.add_tokens(MARKUP_TOKENS, special_tokens=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def _build(out: Path, seed: int, warmup_steps: int) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from launchers.tiny_model_warmup import warm_up

    vocab = _train_tokenizer(out)
    # Round the embedding table up to a multiple of 64, as real checkpoints do; extra rows are never
    # produced by the tokenizer.
    config = Qwen3Config(**{k: v for k, v in tiny_model_config(-(-vocab // 64) * 64).items()
                            if k not in ("architectures", "model_type")})
    tokenizer = AutoTokenizer.from_pretrained(out)
    config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config.pad_token_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    warm_up(model, tokenizer, seed, steps=warmup_steps, lines=_prose_lines(), log_every=25)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(eos_token_id=[config.eos_token_id, config.pad_token_id],
                     pad_token_id=config.pad_token_id).save_pretrained(out)


class TinyModelError(RuntimeError):
    """The committed tiny model is not the one its BUILD.json describes."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def committed_tiny_model(directory: Path = COMMITTED_MODEL) -> Path | None:
    """The committed default model, its files checked against BUILD.json; None if it is absent or
    was built by another BUILDER_VERSION (then it is rebuilt into the cache, and `--commit`
    refreshes the committed copy). A file that does not match its recorded hash is an error: a
    silently different model would make every figure and test on this machine about another model.
    """
    manifest = directory / _MANIFEST
    if not manifest.exists():
        return None
    build = json.loads(manifest.read_text())
    if build.get("builder") != BUILDER_VERSION:
        return None
    check_build_hashes(directory, rebuild="python -m launchers.tiny_model --commit")
    return directory


def check_build_hashes(directory: Path, *, rebuild: str) -> dict:
    """A committed model's BUILD.json, after checking every file it lists against its sha256.

    Raises TinyModelError naming the file and both fixes (restore it from git, or rebuild it with
    `rebuild`): a silently different model would make every figure and test about another model.
    """
    manifest = directory / _MANIFEST
    build = json.loads(manifest.read_text())
    for name, digest in build["files"].items():
        path = directory / name
        if not path.is_file() or _sha256(path) != digest:
            raise TinyModelError(
                f"{path} does not match the sha256 in {manifest}: the committed model was changed "
                f"or damaged. Restore it (git checkout -- {directory}) or rebuild it with "
                f"`{rebuild}`.")
    return build


def commit_tiny_model(built: Path, directory: Path = COMMITTED_MODEL) -> Path:
    """Copy a built default model to `directory` with a BUILD.json of hashes and provenance."""
    import torch

    staging = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(built, staging, ignore=shutil.ignore_patterns(".complete", ".*.lock"))
    files = {p.name: _sha256(p) for p in sorted(staging.iterdir()) if p.is_file()}
    (staging / _MANIFEST).write_text(json.dumps({
        "builder": BUILDER_VERSION, "seed": DEFAULT_SEED, "warmup_steps": WARMUP_STEPS,
        "cache_key": _cache_key(DEFAULT_SEED, WARMUP_STEPS), "torch": torch.__version__,
        "python": sysconfig.get_python_version(), "built_by": "python -m launchers.tiny_model --commit",
        "files": files}, indent=1) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    return directory


def build_tiny_model(seed: int = DEFAULT_SEED, root: Path | None = None,
                     warmup_steps: int = WARMUP_STEPS) -> Path:
    """The tiny model's directory: the committed default when that is what is asked for, else the
    model for `seed` built here (or found in the cache)."""
    if root is None and seed == DEFAULT_SEED and warmup_steps == WARMUP_STEPS:
        committed = committed_tiny_model()
        if committed is not None:
            return committed
    root = root or cache_dir() / "models"
    target = root / f"tiny-qwen3-{_cache_key(seed, warmup_steps)}"
    if (target / ".complete").exists():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # One builder at a time (parallel test processes all ask for it); the others wait and reuse.
    with open(root / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        for stale in root.glob("tiny-build-*"):  # left by a builder that was killed mid-build
            shutil.rmtree(stale, ignore_errors=True)
        # Build in a temp dir and rename: a crash mid-build never leaves a half model in the cache.
        staging = Path(tempfile.mkdtemp(prefix="tiny-build-", dir=root))
        try:
            _build(staging, seed, warmup_steps)
            (staging / ".complete").write_text(json.dumps({"seed": seed, "builder": BUILDER_VERSION}))
            staging.chmod(0o755)
            if target.exists():
                shutil.rmtree(target)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m launchers.tiny_model",
                                     description="Find (or build) the tiny default model and print its path.")
    parser.add_argument("--commit", action="store_true",
                        help=f"build the default model (or take it from the cache) and write it to {COMMITTED_MODEL}")
    args = parser.parse_args(argv)
    if args.commit:
        print(commit_tiny_model(build_tiny_model(root=cache_dir() / "models")))
    else:
        print(build_tiny_model())


if __name__ == "__main__":
    main()
