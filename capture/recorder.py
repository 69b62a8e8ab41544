"""What one engine call produced: prompt ids, sampled ids, logprobs and the assistant message.

`CallRecorder` reads a non-streaming reply whole (`add_reply`) or a stream chunk by chunk
(`add_chunk`), never mutating what it reads (the dialect's encoder gets the same chunk next).
`check()` raises `EngineNoTokenIds` if the reply has no ids at all; the route calls it before
answering, so a misconfigured engine is an error the agent sees. `result()` returns the `Capture`
(or raises `EngineNoTokenIds` for ids that are not token ids). A whole reply's per-token work (the
id/logprob pairing below) is left to `result()`, which the route calls after the agent has its
answer: it is a Python loop per sampled token, and the agent need not wait on it.

Where each field comes from (vLLM 0.32 with --return-tokens-as-token-ids):

    prompt ids       reply["prompt_token_ids"]            (streaming: first chunk only)
    completion ids   choices[0]["token_ids"]              (streaming: the delta ids per chunk)
    logprobs         choices[0]["logprobs"]["content"][i]["logprob"], token "token_id:N"

The id and logprob channels are joined by position, and an off-by-one still trains (on the wrong
tokens). So every entry's `token_id:N` is checked against the id at its position; on a
disagreement the call's logprobs are dropped (its tokens become context, mask 0) and the reason is
recorded, never guessed around. Non-finite logprobs are dropped the same way, position by position.

What it refuses: to invent ids. A reply without prompt or completion ids is a failed call.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field
from typing import Any

from .errors import EngineNoTokenIds
from .tokens import IdText

__all__ = ["Capture", "CallRecorder"]

_NAN = float("nan")


@dataclass(slots=True)
class Capture:
    """The token record of one successful engine call."""

    prompt_ids: IdText  # the engine's prompt ids, as text (parsed only where new: graph.add)
    completion_ids: array  # array('i')
    logprobs: array  # array('d'), NaN where missing
    missing_logprobs: dict[str, int]  # reason -> count of completion tokens without a logprob
    message: dict[str, Any]  # the assistant message in chat form
    finish_reason: str | None
    usage: dict[str, Any] = field(default_factory=dict)


class CallRecorder:
    """Accumulates one call. Streaming calls feed chunks; non-streaming calls feed one reply."""

    __slots__ = (
        "_content",
        "_finish",
        "_ids",
        "_lp_missing",
        "_lps",
        "_prompt",
        "_reasoning",
        "_tool_calls",
        "_usage",
        "_whole",
    )

    def __init__(self) -> None:
        self._prompt: Any = None
        self._ids: list[int] = []
        self._lps: list[float] = []
        self._lp_missing: dict[str, int] = {}
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tool_calls: dict[int, dict[str, Any]] = {}
        self._finish: str | None = None
        self._usage: dict[str, Any] = {}
        self._whole: dict[str, Any] | None = None  # a whole reply's choice, tokens not yet read

    # --- input ----------------------------------------------------------------------------
    def add_reply(self, reply: dict[str, Any], prompt: IdText | None = None) -> None:
        """A whole reply; `prompt` is its prompt ids already cut out of the raw bytes (tokens).
        Its tokens are read in result(), after the agent is answered."""
        self._prompt = prompt if prompt is not None else reply.get("prompt_token_ids")
        self._whole = self._read(reply, "message")

    def set_prompt(self, prompt: IdText) -> None:
        """The streamed reply's prompt ids, cut out of its first event by the engine client."""
        self._prompt = prompt

    def add_chunk(self, chunk: dict[str, Any]) -> None:
        """One streamed chunk: its tokens are read now (each chunk carries its delta's ids)."""
        if self._prompt is None and chunk.get("prompt_token_ids") is not None:
            self._prompt = chunk["prompt_token_ids"]
        self._take_tokens(self._read(chunk, "delta"))

    def _read(self, reply: dict[str, Any], part: str) -> dict[str, Any]:
        """What a whole reply (`part` "message") and a chunk (`part` "delta") have alike: usage,
        the first choice's text, reasoning and tool calls (whole, or pieces merged by index),
        and its finish reason. Returns that choice."""
        if isinstance(reply.get("usage"), dict):
            self._usage = reply["usage"]
        choice = _first_choice(reply)
        message = choice.get(part)
        if isinstance(message, dict):
            if isinstance(message.get("content"), str):
                self._content.append(message["content"])
            reasoning = message.get("reasoning") or message.get("reasoning_content")
            if isinstance(reasoning, str):
                self._reasoning.append(reasoning)
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                for i, call in enumerate(calls):
                    if not isinstance(call, dict):
                        continue
                    if part == "message":
                        self._tool_calls[i] = call
                    else:
                        self._merge_tool_call(call)
        if choice.get("finish_reason"):
            self._finish = choice["finish_reason"]
        return choice

    def _take_tokens(self, choice: dict[str, Any]) -> None:
        ids = choice.get("token_ids")
        if not ids or not isinstance(ids, list):
            return
        entries = (choice.get("logprobs") or {}).get("content") if isinstance(
            choice.get("logprobs"), dict
        ) else None
        self._ids.extend(ids)
        if not isinstance(entries, list) or len(entries) != len(ids):
            self._miss("engine_sent_no_logprobs", len(ids))
            self._lps.extend([_NAN] * len(ids))
            return
        for token_id, entry in zip(ids, entries, strict=True):
            logprob = entry.get("logprob") if isinstance(entry, dict) else None
            token = entry.get("token") if isinstance(entry, dict) else None
            if isinstance(token, str) and token.startswith("token_id:") and (
                token[9:] != str(token_id)
            ):
                self._miss("logprob_pairing_mismatch", 1)
                self._lps.append(_NAN)
            elif (
                isinstance(logprob, bool)
                or not isinstance(logprob, int | float)
                or not math.isfinite(logprob)
                or logprob > 0
            ):
                self._miss("non_finite_logprob", 1)
                self._lps.append(_NAN)
            else:
                self._lps.append(float(logprob))

    def _miss(self, reason: str, count: int) -> None:
        self._lp_missing[reason] = self._lp_missing.get(reason, 0) + count

    def _merge_tool_call(self, piece: dict[str, Any]) -> None:
        index = piece.get("index", len(self._tool_calls))
        index = index if isinstance(index, int) else len(self._tool_calls)
        call = self._tool_calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if piece.get("id"):
            call["id"] = piece["id"]
        function = piece.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                call["function"]["name"] += function["name"]
            if isinstance(function.get("arguments"), str):
                call["function"]["arguments"] += function["arguments"]

    # --- output ---------------------------------------------------------------------------
    @property
    def n_completion(self) -> int:
        return len(self._ids)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self._content) or None}
        if self._reasoning:
            message["reasoning"] = "".join(self._reasoning)  # vLLM 0.32's name
        if self._tool_calls:
            message["tool_calls"] = [self._tool_calls[i] for i in sorted(self._tool_calls)]
        return message

    def check(self) -> None:
        """Raise EngineNoTokenIds if the engine sent no prompt ids, or sampled tokens without
        saying which (cheap: nothing is parsed or paired here)."""
        prompt = self._prompt
        if not ((isinstance(prompt, IdText) and prompt.text)
                or (isinstance(prompt, list) and prompt)):
            raise EngineNoTokenIds("prompt_token_ids")
        ids = self._whole.get("token_ids") if self._whole is not None else self._ids
        if not (isinstance(ids, list) and ids) and self._usage.get("completion_tokens"):
            raise EngineNoTokenIds("choices[0].token_ids")

    def result(self) -> Capture:
        """The call's capture; raises EngineNoTokenIds if the engine sent no usable ids."""
        if self._whole is not None:
            choice, self._whole = self._whole, None
            self._take_tokens(choice)
        prompt_ids = self._prompt
        if isinstance(prompt_ids, list) and prompt_ids:
            prompt_ids = IdText.from_ids(prompt_ids)
        if not isinstance(prompt_ids, IdText) or not prompt_ids.text:
            raise EngineNoTokenIds("prompt_token_ids")
        if not self._ids and self._usage.get("completion_tokens"):
            # The engine sampled tokens but did not say which: return_token_ids was ignored.
            # (Zero sampled tokens with usage agreeing is a legitimate, empty, completion.)
            raise EngineNoTokenIds("choices[0].token_ids")
        # The prompt ids stay text here; the graph parses and checks the ones that are new
        # (graph.RolloutGraph.add), so a call costs O(its new tokens), not O(its prompt).
        try:
            completion = array("i", self._ids)
            if completion and min(completion) < 0:
                raise ValueError("completion ids must be non-negative")
        except (TypeError, OverflowError, ValueError) as exc:
            raise EngineNoTokenIds(f"valid token ids ({exc})") from exc
        return Capture(
            prompt_ids=prompt_ids,
            completion_ids=completion,
            logprobs=array("d", self._lps),
            missing_logprobs=dict(self._lp_missing),
            message=self.message(),
            finish_reason=self._finish,
            usage=self._usage,
        )


def _first_choice(reply: dict[str, Any]) -> dict[str, Any]:
    choices = reply.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return {}
