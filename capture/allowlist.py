"""The engine samples only under the trainer's policy: what of an agent's request may reach vLLM.

Why: vLLM's chat route takes many fields that change WHICH tokens can be sampled or HOW their
logprobs read: `logit_bias`, `allowed_token_ids`, `bad_words`, `min_tokens`, `ignore_eos`,
guided / structured decoding (`guided_*`, `structured_outputs`, `response_format` with a JSON
schema, and `tool_choice: "required"` or a named function, which vLLM serves with a JSON grammar),
beam search, a `seed`. A reply sampled under any of them is recorded with logprobs of a
distribution the trainer never chose, and GRPO's importance ratios are then wrong with no error
anywhere. The policy being trained writes the agent's requests (it is an optimizer pointed at
everything it can touch), so every field is either known to be harmless or does not reach the
engine.

The rule is an allowlist over the chat body each dialect translates to (`Dialect.to_chat`), applied
by the core to every call (`restrict`), after the dialect and before the session's sampling policy
(`capture.sampling`) rewrites the knobs:

    kept as sent      messages, tools, parallel_tool_calls (vLLM drops extra calls AFTER sampling),
                      stream, tool_choice "auto" | "none" (no grammar: the tool parser reads the
                      text after sampling), `stop` (ends the reply at a string; the tokens kept
                      are sampled under the policy, as with a `max_tokens` cut; at most
                      MAX_STOP strings of at most MAX_STOP_CHARS characters, else a 400)
    rewritten         model (the engine's), temperature, top_p, top_k, min_p, the three penalties
                      (the session's policy), max_tokens / max_completion_tokens (capped by the
                      policy), n (1), logprobs / top_logprobs / return_token_ids (the capture's),
                      stream_options (only include_usage, always on)
    downgraded        tool_choice "required" / a named function -> "auto" (an agent works on
                      without it: the model calls a tool or it does not); counted as a drop
    dropped           every other field, counted, whatever it is: the ones named above, and
                      `seed` (the trainer, not the agent, decides sampling randomness: a seed
                      repeated across a GRPO group makes its samples one sample), `chat_template`,
                      `chat_template_kwargs`, `add_generation_prompt`, `continue_final_message`
                      (the prompt is the template the trainer serves), `prompt_logprobs`, `echo`,
                      `priority`, `user`, `metadata`, ...

A value that asks for nothing (None, a switch at vLLM's default, an empty object or list,
`response_format: {"type": "text"}`) is dropped without being counted. Each counted drop is named
in the call's metadata (`dropped_fields`, in the trace's turn metadata and on failed calls too)
and summed per session (`stats["dropped_fields"]`), so a trace says when an agent tried; nothing
is refused for it, since an agent could not tell why its call failed and the trained policy would
only learn to avoid a field the proxy removes anyway.

Per dialect (what of the agent's own request can reach this chat body at all):

    chat        every top-level field is copied (`ChatDialect.to_chat`), so this allowlist is what
                keeps vLLM's extensions out
    responses   instructions/input -> messages, tools, tool_choice, parallel_tool_calls,
                temperature, top_p, max_output_tokens, stream, and `text.format` -> response_format
                (dropped here); nothing else is translated
    messages    system/messages -> messages, tools, tool_choice, temperature, top_p, top_k,
                max_tokens, stop_sequences -> stop, stream; nothing else is translated
"""

from __future__ import annotations

from typing import Any

from .errors import BadRequest

__all__ = ["KEPT", "MAX_STOP", "MAX_STOP_CHARS", "REWRITTEN", "restrict"]

KEPT = frozenset({"messages", "tools", "tool_choice", "parallel_tool_calls", "stream", "stop"})
REWRITTEN = frozenset({
    "model", "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
    "repetition_penalty", "max_tokens", "max_completion_tokens", "n", "logprobs", "top_logprobs",
    "return_token_ids", "stream_options",
})
MAX_STOP = 16
MAX_STOP_CHARS = 1000


# vLLM switches that are on by default: turning them off is what asks for something.
_ON_BY_DEFAULT = frozenset({"add_generation_prompt", "skip_special_tokens",
                            "spaces_between_special_tokens"})


def _asks_nothing(key: str, value: Any) -> bool:
    if value is None or value == {} or value == []:
        return True
    if isinstance(value, bool):
        return value is (key in _ON_BY_DEFAULT)
    return key == "response_format" and value == {"type": "text"}


def _check_stop(stop: Any) -> None:
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, list) or not all(isinstance(s, str) for s in values):
        raise BadRequest("stop must be a string or a list of strings")
    if len(values) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in values):
        raise BadRequest(f"stop takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} "
                         "characters each")


def restrict(chat: dict[str, Any]) -> list[str]:
    """Drop from `chat` (in place) every field the allowlist does not keep; return the names of
    the counted drops, sorted. Raises BadRequest for a `stop` the engine should not be given."""
    dropped = []
    for key in [k for k in chat if k not in KEPT and k not in REWRITTEN]:
        value = chat.pop(key)
        if not _asks_nothing(key, value):
            dropped.append(key)
    choice = chat.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        chat["tool_choice"] = "auto"
        dropped.append("tool_choice")
    if chat.get("stop") is not None:
        _check_stop(chat["stop"])
    if chat.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    else:
        chat.pop("stream_options", None)
    dropped.sort()
    return dropped
