"""A scripted stand-in for vLLM 0.32 serving the tiny model: the test chooses every reply.

Why it exists: the tiny model is rebuilt on every new machine and its greedy answers to the
agents' real prompts differ from one machine to the next (issue 14), so a test whose subject is
the capture, an agent's dialect or the rollout graph cannot wait for the model to happen to call a
tool. Here a `script(request) -> str` writes the assistant's raw text instead (a hermes
`<tool_call>` or plain words), and everything around it is what vLLM would do with that text:

  * the prompt ids are the REAL tiny tokenizer's rendering of the request, as vLLM 0.32 renders
    it (vllm/renderers/chat_utils.py): content as lists of text parts (a tool message's joined
    with "\\n"), tool-call arguments parsed from JSON strings to objects, Claude Code's billing
    header line dropped from the system prompt, tools as vLLM's pydantic model dumps them,
    `apply_chat_template(messages, tools=...,
    add_generation_prompt=True)`, the text encoded without special tokens; so a conversation
    the agent sends back unchanged extends the previous prompt + completion token for token, as
    with real vLLM (tests/test_scripted_engine.py compares the ids with vLLM's own /tokenize);
  * the completion ids are the real tokenizer's encoding of the reply, plus `<|im_end|>` (the
    eos vLLM stops on, which it returns in `token_ids` and logprobs but not in the text); a reply
    longer than the request's `max_tokens` is cut there with finish_reason "length";
  * tool calls are parsed as vLLM's hermes parser does (`<tool_call>\\n{json}\\n</tool_call>`,
    arguments re-serialised with `json.dumps(..., ensure_ascii=False)`, ids `chatcmpl-tool-...`,
    content the text before the first call or null; a call whose JSON does not parse leaves the
    whole text as content); finish_reason "tool_calls" when a call was parsed (streaming: only
    when the reply was not cut by max_tokens, as vLLM's stream does);
  * the wire shape: top-level `prompt_token_ids`, `choices[0].token_ids` and logprob entries
    reading `token_id:N` (each only when the request asks, as vLLM does), usage; streaming sends a
    role chunk carrying the prompt ids, one chunk per sampled token with its id and logprob
    (content pieces, or a tool call's id + name and then argument fragments, or an empty delta
    inside the call's markup), finish_reason on the last token, a usage chunk when
    `stream_options.include_usage`, and `data: [DONE]`.

The request rendering and the hermes parsing are in vllm_chat.py. Logprobs are made up (finite,
negative, a function of the position); nothing samples. What it
does not emulate: `n` > 1 and a reply that contains one of the request's stop strings (both get
a 500 that says so, never an answer unlike vLLM's), guided decoding, several tokens per
streamed chunk, and of reasoning parsers all but one case: with `reasoning_parser=True` a think
block the script writes is split off as `reasoning` (vllm_chat.split_reasoning). A request for
another model name gets vLLM's 404; a prompt + max_tokens over `max_model_len` gets its 400. If the script raises, the request gets a 500 naming the error and
the error is kept in `errors`.

Use (the capture proxy in front of it, a real agent CLI in front of that):

    with ScriptedEngine(tiny_model_path, script) as engine, CaptureServer(engine.url) as proxy:
        ...
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from capture.fake_engine import answer_lifespan, check_chat_request, send_json
from capture.serving import ThreadedUvicorn, read_body
from capture.upstream import dumps, loads
from harness.audit.vllm_chat import parse_hermes, split_reasoning, vllm_messages, vllm_tools

__all__ = [
    "SHELL_TOOL_NAMES",
    "ScriptedEngine",
    "parse_hermes",
    "scripted_logprob",
    "shell_call",
    "shell_task",
    "shell_tool_name",
    "tool_call",
    # vLLM's side of a chat request (vllm_chat.py), importable from here for the tests
    "vllm_messages",
    "vllm_tools",
]

EOS = "<|im_end|>"
# The shell tool of each agent: opencode and mini-swe-agent `bash`, Claude Code `Bash`, Codex
# `exec_command` (older Codex builds: `shell`).
SHELL_TOOL_NAMES = ("bash", "Bash", "exec_command", "shell", "local_shell")


def scripted_logprob(position: int) -> float:
    """The logprob the engine reports for the completion token at `position` (made up, exact in
    binary, so a test can compare what was recorded with ==)."""
    return -0.125 - (position % 8) / 16


def tool_call(name: str, **arguments: Any) -> str:
    """The model text of one hermes tool call, exactly as the tiny model's chat template renders
    that call back into the history (so the agent's next prompt extends this completion)."""
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def shell_tool_name(request: dict[str, Any]) -> str:
    """The agent's shell tool among `request["tools"]` (a chat request body, as the engine gets it).

    Raises LookupError naming the tools that were offered when none is a shell tool."""
    names = [
        tool.get("function", {}).get("name")
        for tool in request.get("tools") or []
        if isinstance(tool, dict)
    ]
    for candidate in SHELL_TOOL_NAMES:
        if candidate in names:
            return candidate
    raise LookupError(
        f"no shell tool ({', '.join(SHELL_TOOL_NAMES)}) among the request's tools "
        f"{names}: is this an aux call (no tools), or an agent whose shell tool "
        f"needs adding to SHELL_TOOL_NAMES?"
    )


def shell_call(request: dict[str, Any], command: str, description: str = "Run a command") -> str:
    """A hermes call of the agent's shell tool running `command`, with the argument names its
    schema asks for (Codex's `exec_command` takes `cmd`; Claude Code's `Bash` a description too)."""
    name = shell_tool_name(request)
    arguments: dict[str, Any] = {"cmd": command} if name == "exec_command" else {"command": command}
    if name == "Bash":
        arguments["description"] = description
    return tool_call(name, **arguments)


def shell_task(
    *commands: str, final: str = "Done.", title: str = "A title"
) -> Callable[[dict[str, Any]], str]:
    """A script that plays a task with the agent's shell tool: on a call with k tool results in
    its history it runs `commands[k]`, after the last one it answers `final`; a call without
    tools (a title, a probe, a side call) gets `title`."""

    def script(request: dict[str, Any]) -> str:
        if not request.get("tools"):
            return title
        step = sum(1 for m in request["messages"] if m.get("role") == "tool")
        return shell_call(request, commands[step]) if step < len(commands) else final

    return script


class ScriptedEngine:
    """vLLM's chat-completions wire shape around scripted replies, on 127.0.0.1 (a free port).

    `url` is what CaptureServer takes as its engine URL; `requests` holds every chat request body
    received for the served model, in order; `replies` the script's text for each (None where the
    script raised); `errors` what the script raised.
    """

    def __init__(
        self,
        tokenizer_path: Path,
        script: Callable[[dict[str, Any]], str],
        model: str = "tiny",
        *,
        max_model_len: int = 32768,
        reasoning_parser: bool = False,
    ) -> None:
        """`reasoning_parser`: split a reply's think block off as `reasoning`, as vLLM's `qwen3`
        parser does (vllm_chat.split_reasoning); off, the block stays in the content."""
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
        self.eos_id = self.tokenizer.convert_tokens_to_ids(EOS)
        if not isinstance(self.eos_id, int) or self.eos_id == self.tokenizer.unk_token_id:
            raise ValueError(
                f"{tokenizer_path} has no {EOS} token: the scripted engine speaks "
                "the tiny model's ChatML (launchers.tiny_model.build_tiny_model())"
            )
        self.script = script
        self.model = model
        self.max_model_len = max_model_len
        self.reasoning_parser = reasoning_parser
        self.requests: list[dict[str, Any]] = []
        self.replies: list[str | None] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._runner = ThreadedUvicorn(self, "127.0.0.1", 0)
        self.url = ""

    def start(self) -> ScriptedEngine:
        self.url = f"http://127.0.0.1:{self._runner.start()}"
        return self

    def stop(self) -> None:
        self._runner.stop()

    def __enter__(self) -> ScriptedEngine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what vLLM would compute ------------------------------------------------------------
    def prompt_ids(self, body: dict[str, Any]) -> list[int]:
        """The request's prompt ids, rendered and encoded as vLLM does (module docstring)."""
        text = self.tokenizer.apply_chat_template(
            vllm_messages(body["messages"]),
            tools=vllm_tools(body.get("tools")),
            tokenize=False,
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=body.get("continue_final_message", False),
            **(body.get("chat_template_kwargs") or {}),
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def completion_ids(self, reply: str) -> list[int]:
        """The reply's ids, ending with `<|im_end|>` (added unless the script wrote it)."""
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return ids if ids and ids[-1] == self.eos_id else [*ids, self.eos_id]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    # --- serving ----------------------------------------------------------------------------
    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await answer_lifespan(receive, send)
            return
        path = scope["path"]
        if path == "/health":
            await send_json(send, 200, {})
            return
        if path == "/v1/models":
            await send_json(
                send,
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model,
                            "object": "model",
                            "owned_by": "vllm",
                            "max_model_len": self.max_model_len,
                        }
                    ],
                },
            )
            return
        if path != "/v1/chat/completions" or scope.get("method") != "POST":
            await send_json(send, 404, _error(f"scripted engine: no route {path}", 404))
            return
        try:
            body = loads(await read_body(receive))
            check_chat_request(body)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            await send_json(send, 400, _error(f"scripted engine: bad request: {exc}", 400))
            return
        if body.get("model") != self.model:
            await send_json(
                send,
                404,
                _error(f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError"),
            )
            return
        try:
            reply: str | None = self.script(body)
            if not isinstance(reply, str):
                raise TypeError(f"the script returned {type(reply).__name__}, not the reply text")
            prompt = self.prompt_ids(body)
        except Exception as exc:  # noqa: BLE001 - any script failure is the request's 500
            self.errors.append(exc)
            reply = None
        with self._lock:
            self.requests.append(body)
            self.replies.append(reply)
        if reply is None:
            await send_json(send, 500, _error(f"scripted engine: {self.errors[-1]!r}", 500))
            return
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if len(prompt) + (max_tokens or 1) > self.max_model_len:
            await send_json(
                send,
                400,
                _error(
                    f"This model's maximum context length is {self.max_model_len} tokens. However, "
                    f"you requested {len(prompt) + (max_tokens or 1)} tokens ({len(prompt)} in the "
                    f"messages, {max_tokens or 1} in the completion).",
                    400,
                ),
            )
            return
        stops = body.get("stop") or []
        hit = [stop for stop in ([stops] if isinstance(stops, str) else stops) if stop in reply]
        unsupported = (
            f"the reply contains the request's stop strings {hit}"
            if hit
            else f"the request asks for n={body['n']}"
            if (body.get("n") or 1) != 1
            else ""
        )
        if unsupported:  # refused loudly rather than answered unlike vLLM
            self.errors.append(ValueError(unsupported))
            await send_json(
                send,
                500,
                _error(
                    f"scripted engine: {unsupported}, which is not emulated: change the script", 500
                ),
            )
            return
        completion = self.completion_ids(reply)
        finish = "stop"
        if max_tokens is not None and len(completion) > max_tokens:
            completion, finish = completion[:max_tokens], "length"
        text = self._decode(completion)
        reasoning, text = split_reasoning(text) if self.reasoning_parser else (None, text)
        content, calls = parse_hermes(text) if body.get("tools") else (text, [])
        if reasoning is not None and calls and not (content or "").strip():
            content = None  # vLLM's qwen3 + hermes drop whitespace-only content beside calls
        if body.get("stream"):
            # vLLM's stream says "tool_calls" only when the model stopped by itself
            finish = "tool_calls" if calls and finish == "stop" else finish
            await self._stream(send, body, prompt, completion, calls, finish, reasoning)
        else:
            finish = "tool_calls" if calls else finish
            whole = self._whole(body, prompt, completion, content or None, calls, finish)
            whole["choices"][0]["message"]["reasoning"] = reasoning
            await send_json(send, 200, whole)

    def _entries(self, completion: list[int]) -> list[dict[str, Any]]:
        """Logprob entries as vLLM writes them with --return-tokens-as-token-ids."""
        # `bytes` are those of the "token_id:N" string, as vLLM writes them in this mode.
        return [
            {
                "token": f"token_id:{token}",
                "logprob": scripted_logprob(i),
                "bytes": list(f"token_id:{token}".encode()),
                "top_logprobs": [],
            }
            for i, token in enumerate(completion)
        ]

    def _whole(
        self,
        body: dict[str, Any],
        prompt: list[int],
        completion: list[int],
        content: str | None,
        calls: list[dict[str, Any]],
        finish: str,
    ) -> dict[str, Any]:
        message = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "tool_calls": calls,
            "reasoning": None,
        }
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": finish,
            "stop_reason": None,
            "logprobs": {"content": self._entries(completion)} if body.get("logprobs") else None,
        }
        reply: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": _usage(prompt, completion),
            "prompt_logprobs": None,
            "kv_transfer_params": None,
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = completion
            reply["prompt_token_ids"] = prompt
        return reply

    def _deltas(self, completion: list[int], calls: list[dict[str, Any]],
                reasoning: str | None = None) -> list[dict[str, Any]]:
        """One delta per completion token: a think block's text as reasoning pieces (with
        `reasoning` on, up to its `</think>`), the text before the first tool call as content
        pieces; then per call an empty delta on its markup tokens, its id + name on its first
        JSON token and its arguments in fragments over the JSON tokens after that."""
        start_id = self.tokenizer.convert_tokens_to_ids("<tool_call>")
        end_id = self.tokenizer.convert_tokens_to_ids("</tool_call>")
        think_end = self.tokenizer.convert_tokens_to_ids("</think>")
        n_think = completion.index(think_end) + 1 if reasoning is not None else 0
        starts = [i for i, t in enumerate(completion) if t == start_id] if calls else []
        n_text = starts[0] if starts else len(completion)
        deltas: list[dict[str, Any]] = []
        held = 0  # the first token whose text has not been sent yet
        if n_think and calls and not self._decode(completion[n_think:n_text]).strip():
            n_text = n_think  # whitespace-only content beside calls is dropped (as when whole)
        for i in range(len(completion)):
            if i == n_think:
                held = n_think  # the markup itself is sent as neither
            piece = self._decode(completion[held : i + 1]) if i < n_text else ""
            if piece.endswith("\ufffd"):  # a character split across tokens: wait for the rest
                piece = ""
            else:
                held = i + 1
            key = "reasoning" if i < n_think else "content"
            piece = piece.replace("<think>", "").replace("</think>", "") if i < n_think else piece
            deltas.append({key: piece} if piece else {})
        for index, (call, start) in enumerate(zip(calls, starts, strict=True)):
            end = next(
                (i for i in range(start + 1, len(completion)) if completion[i] == end_id),
                len(completion),
            )
            inner = list(range(start + 1, end)) or [start]
            # vLLM writes `content: null` beside each tool-call fragment
            deltas[inner[0]] = {
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "index": index,
                        "function": {"name": call["function"]["name"]},
                    }
                ],
            }
            arguments = call["function"]["arguments"]
            rest = inner[1:] or inner
            size = -(-len(arguments) // len(rest))
            for k, position in enumerate(rest):
                if fragment := arguments[k * size : (k + 1) * size]:
                    entry = {"index": index, "function": {"arguments": fragment}}
                    deltas[position].setdefault("content", None)
                    deltas[position].setdefault("tool_calls", []).append(entry)
        return deltas

    async def _stream(
        self,
        send: Any,
        body: dict[str, Any],
        prompt: list[int],
        completion: list[int],
        calls: list[dict[str, Any]],
        finish: str,
        reasoning: str | None = None,
    ) -> None:
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
        }
        with_ids = bool(body.get("return_token_ids"))
        first: dict[str, Any] = {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if with_ids:
            first["prompt_token_ids"] = prompt
        chunks = [first]
        entries = self._entries(completion) if body.get("logprobs") else None
        for i, delta in enumerate(self._deltas(completion, calls, reasoning)):
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": {"content": [entries[i]]} if entries else None,
                "finish_reason": finish if i == len(completion) - 1 else None,
            }
            if i == len(completion) - 1:
                choice["stop_reason"] = None
            if with_ids:
                choice["token_ids"] = [completion[i]]
            chunks.append({**base, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": _usage(prompt, completion)})
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")],
            }
        )
        for chunk in chunks:
            await send(
                {
                    "type": "http.response.body",
                    "body": b"data: " + dumps(chunk) + b"\n\n",
                    "more_body": True,
                }
            )
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def _usage(prompt: list[int], completion: list[int]) -> dict[str, Any]:
    return {
        "prompt_tokens": len(prompt),
        "total_tokens": len(prompt) + len(completion),
        "completion_tokens": len(completion),
        "prompt_tokens_details": None,
    }


def _error(message: str, code: int, kind: str = "BadRequestError") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
