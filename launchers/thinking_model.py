"""The tiny thinking model: the tiny model's weights with Qwen3's thinking chat template.

Why it exists: a thinking model changes what a rollout looks like on the wire and in the tokens.
Its replies carry reasoning (a chat `reasoning` field, Responses reasoning items, Anthropic
thinking blocks), the agent sends it back on the next turn, and Qwen3's template renders that
reasoning only for the assistant turns after the last user query: a new user turn drops every
earlier turn's thinking, so the next prompt is no longer an extension of the last prompt plus its
completion (a rewritten history the capture graph and the trainer's rows must handle). Tool
results do not count as a user query, so reasoning is kept between tool calls (the behaviour
Qwen3.5 documents too). None of this can be tested with a template that renders every turn's
reasoning, as `models/tiny-qwen3`'s does.

What is built, into `models/tiny-qwen3-thinking/` (`python -m launchers.thinking_model`):
- the weights and the tokenizer of `models/tiny-qwen3`, by relative symlink (the same 1.6 MB are
  not committed twice); its tokenizer already has `<think>` and `</think>` as single tokens
  (ids 4094 and 4095, launchers/tiny_model.py MARKUP_TOKENS), which vLLM's `qwen3` reasoning
  parser requires;
- `chat_template.jinja`: the tiny model's ChatML + hermes tool-call template with Qwen3's
  reasoning logic (Qwen/Qwen3-0.6B's template, read for its behaviour, written here): an assistant
  turn after the last user query renders `<think>\\n{reasoning}\\n</think>\\n\\n{content}`, an
  earlier one only its content; reasoning left inside the content (`...</think>...`, what an agent
  sends back when the engine ran without a reasoning parser) is split out the same way;
  `enable_thinking=false` prefills an empty think block. vLLM 0.32 hands an assistant message's
  reasoning to the template as both `reasoning` and `reasoning_content`
  (vllm/renderers/chat_utils.py `_parse_chat_message_content`), after renaming a request's
  `reasoning_content` to `reasoning` (ChatCompletionRequest `_normalize_messages_before`); the
  template reads either.
  One deliberate difference: Qwen3 counts a user message as a query only when its content is a
  string; here a list of text parts counts too, since vLLM may hand content to the template either
  way and a query should not stop being one because of its encoding.
- `harness.json`: `{"reasoning_parser": "qwen3"}`, the model's own word that it thinks, so the
  engine launcher can turn on vLLM's matching reasoning parser without a flag a user must know;
- `BUILD.json` with the sha256 of every file (checked by `launchers.tiny_model.check_build_hashes`).

What it does not do: think. The tiny model never learned to emit `<think>`; with vLLM's `qwen3`
parser, whatever it writes before a tool call (or instead of one) is parsed as reasoning, which is
enough for the wire. Tests that need chosen reasoning script the replies
(harness/audit/scripted_engine.py) and keep this template.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from launchers.paths import REPO_ROOT
from launchers.tiny_model import CHAT_TEMPLATE, COMMITTED_MODEL

__all__ = ["HARNESS_CONFIG", "REASONING_PARSER", "THINKING_CHAT_TEMPLATE", "THINKING_MODEL",
           "build_thinking_model", "model_reasoning_parser"]

THINKING_MODEL = REPO_ROOT / "models" / "tiny-qwen3-thinking"
REASONING_PARSER = "qwen3"
HARNESS_CONFIG = "harness.json"  # a model folder's word to Harness (what config.json cannot say)

_LINKED = ("model.safetensors", "tokenizer.json")
_COPIED = ("config.json", "generation_config.json", "tokenizer_config.json")

# The tiny template's pieces, reused so the tool-call markup stays the tiny model's.
_TEXT_MACRO, _REST = CHAT_TEMPLATE.split("{%- endmacro -%}", 1)
_SYSTEM, _REST = _REST.split("{%- for message in messages -%}", 1)
_BEFORE_ASSISTANT, _REST = _REST.split("{%- elif message.role == 'assistant' -%}", 1)
_OLD_REASONING = ("{%- if message.reasoning_content -%}"
                  "{{ '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
                  "{%- endif -%}"
                  "{{ text(message.content) }}")
_CALLS_AND_AFTER = _REST.split(_OLD_REASONING, 1)[1]
_CALLS_AND_AFTER = _CALLS_AND_AFTER.replace("{%- if not loop.first or text(message.content) -%}",
                                            "{%- if not loop.first or content -%}", 1)
_GENERATION = "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
assert _CALLS_AND_AFTER.endswith(_GENERATION), "the tiny template's shape changed"

THINKING_CHAT_TEMPLATE = (
    _TEXT_MACRO + "{%- endmacro -%}" + _SYSTEM
    # Qwen3: the index of the last user query, scanning back past tool results (role "tool", or
    # a user message that is only a <tool_response> block).
    + "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) -%}"
    "{%- for message in messages[::-1] -%}"
    "{%- set index = (messages|length - 1) - loop.index0 -%}"
    "{%- set body = text(message.content) -%}"
    "{%- if ns.multi_step_tool and message.role == 'user'"
    " and not (body.startswith('<tool_response>') and body.endswith('</tool_response>')) -%}"
    "{%- set ns.multi_step_tool = false -%}{%- set ns.last_query_index = index -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for message in messages -%}"
    + _BEFORE_ASSISTANT
    + "{%- elif message.role == 'assistant' -%}"
    "{%- set content = text(message.content) -%}"
    "{%- set reasoning = '' -%}"
    "{%- if message.reasoning is string -%}{%- set reasoning = message.reasoning -%}"
    "{%- elif message.reasoning_content is string -%}{%- set reasoning = message.reasoning_content -%}"
    "{%- elif '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query_index and (loop.last or reasoning) -%}"
    "{{ '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n'"
    " + content.lstrip('\\n') }}"
    "{%- else -%}{{ '<|im_start|>assistant\\n' + content }}"
    "{%- endif -%}"
    + _CALLS_AND_AFTER[: -len(_GENERATION)]
    + "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)


# A hub model says it thinks by its chat template; which vLLM parser reads its output depends on
# its family, by config.json's model_type. Qwen3's thinking templates (hybrid and -Thinking-2507)
# render `</think>` and compute `last_query_index` (where earlier reasoning stops being rendered);
# the tiny model's own template renders `</think>` too but never drops reasoning, and it does not
# think. Only families whose parser was read in vllm/reasoning/__init__.py are listed; another
# thinking model needs a harness.json.
_PARSER_BY_MODEL_TYPE = {"qwen3": "qwen3", "qwen3_moe": "qwen3", "qwen3_next": "qwen3"}


def _chat_template(model_dir: Path) -> str:
    path = model_dir / "chat_template.jinja"
    if path.is_file():
        return path.read_text()
    config = model_dir / "tokenizer_config.json"
    template = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    return template if isinstance(template, str) else ""


def model_reasoning_parser(model_dir: Path) -> str | None:
    """The vLLM reasoning parser a model folder needs, or None for a model that does not think.

    Its harness.json says so first (`reasoning_parser`); otherwise a Qwen3-style thinking template
    (`</think>` and `last_query_index`) in a model family of `_PARSER_BY_MODEL_TYPE` (a Qwen3 snapshot) gets that family's
    parser. A folder with neither gets None, and the engine starts as it always did."""
    model_dir = Path(model_dir)
    path = model_dir / HARNESS_CONFIG
    if path.is_file():
        parser = json.loads(path.read_text()).get("reasoning_parser")
        return parser if isinstance(parser, str) and parser else None
    config = model_dir / "config.json"
    template = _chat_template(model_dir)
    if not config.is_file() or "</think>" not in template or "last_query_index" not in template:
        return None
    return _PARSER_BY_MODEL_TYPE.get(json.loads(config.read_text()).get("model_type"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_thinking_model(directory: Path = THINKING_MODEL, base: Path = COMMITTED_MODEL) -> Path:
    """Write the thinking model's folder; its weights and tokenizer link to `base`'s by a
    relative path (`models/` moves as one tree)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in _LINKED:
        link = directory / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(base.resolve() / name, directory.resolve()))
    for name in _COPIED:
        (directory / name).write_bytes((base / name).read_bytes())
    (directory / "chat_template.jinja").write_text(THINKING_CHAT_TEMPLATE)
    (directory / HARNESS_CONFIG).write_text(
        json.dumps({"reasoning_parser": REASONING_PARSER}, indent=1) + "\n")
    files = {p.name: _sha256(p) for p in sorted(directory.iterdir())
             if p.is_file() and p.name != "BUILD.json"}
    build = {"base": f"models/{base.name}", "built_by": "python -m launchers.thinking_model",
             "linked": list(_LINKED), "files": files}
    (directory / "BUILD.json").write_text(json.dumps(build, indent=1) + "\n")
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launchers.thinking_model",
        description="Write models/tiny-qwen3-thinking: the tiny model's weights and tokenizer "
                    "(linked) under Qwen3's thinking chat template, with its reasoning parser "
                    "named in harness.json and every file hashed in BUILD.json.")
    parser.add_argument("--out", type=Path, default=THINKING_MODEL,
                        help="the folder to write (default: %(default)s)")
    args = parser.parse_args(argv)
    print(build_thinking_model(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
