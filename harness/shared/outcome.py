"""`HarnessRolloutOutcome`: what a reward function sees, built from a TrainingTrace.

Our capture proxy stores every turn in one chat form whatever the agent spoke (`metadata
["dialect"]` says which): `request.new_messages` holds only the messages this call added after
its parent's request and reply (`metadata["parent_id"]`), `response.choices[0].message` the
assistant message, and a conversation's last turn carries its whole transcript in
`request.messages` (older traces: delta `request.messages`, `response.message`; then the
transcript is rebuilt by walking the parents). Anthropic `is_error: true` tool results arrive as
chat tool messages prefixed `[tool error]`.

Traces from other producers (OpenEnv's capture, TRL) keep the wire shapes, so one reader per
dialect turns those into the same few numbers:

    dialect     tool call (in a turn's response)      tool result (in a later turn's request)
    chat        choices[0].message.tool_calls[]        {"role": "tool", "tool_call_id", "content"}
    responses   output[] function_call / custom_tool_call / local_shell_call
                                                       input[] *_call_output {"call_id", "output"}
    messages    content[] {"type": "tool_use"}         user content[] {"type": "tool_result",
                                                         "tool_use_id", "content", "is_error"}

Counting rules (the seed's, TRL 1.16 `_tool_failures_by_name`, made dialect-neutral):
- tool_call_count / tool_calls_by_name: every tool call in every non-aux turn's response.
- Tool failures are counted per call. A result's status is the agent's own record when it has
  one (Anthropic `is_error`, a Responses output's `success` or metadata `exit_code`,
  mini-swe-agent's `{"returncode": N}`): an explicit exit status wins over the text, so exit 0
  with "error" in its output is a success. Only a result with no record is judged by its text
  (error, failed, traceback or exception, any case).
- One call, one count: a result is keyed by the id of the call it answers, so a transcript
  resent on every call counts each failure once, while two calls failing with the same text
  count twice. A result without a call id is keyed by (tool, text, its position among
  identical results of one request): the most any single request holds is what counts.
- completion: the last non-aux turn's request transcript plus its reply, normalised to chat
  message dicts (role, content, tool_calls, tool_call_id) whatever the dialect, so a reward
  function reads one shape.

Aux turns (title, summary, compaction, token counting; `metadata["aux"]`) carry no agent work
and are skipped for counting and for the completion; they stay in `trace`.

This module never scores: `env_reward` is whatever the task's verifier produced (None =
unscored), and the field names match TRL 1.16's `HarnessRolloutOutcome` exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.shared.errors import RewardMissingError
from harness.shared.outcome_readers import READERS, Captured

if TYPE_CHECKING:
    from openenv.core.harness.training import TrainingTrace

__all__ = ["HarnessRolloutOutcome", "build_outcome", "dialect_of", "select_reward"]

Message = dict[str, Any]
_FAILURE_WORDS = ("error", "failed", "traceback", "exception")


@dataclass
class HarnessRolloutOutcome:
    """Same fields, same order as TRL 1.16's HarnessRolloutOutcome (async_grpo.openenv_harness)."""

    env_reward: float | None
    completion: list[Message]
    trace: list[dict[str, Any]]
    tool_call_count: int
    tool_failure_count: int
    tool_calls_by_name: dict[str, int]
    timed_out: bool


def dialect_of(
    turn_metadata: dict[str, Any], request: dict[str, Any], response: dict[str, Any]
) -> str:
    """The turn's dialect: the proxy's `metadata["dialect"]`, else guessed from the shapes."""
    dialect = turn_metadata.get("dialect")
    if dialect in ("chat", "responses", "messages"):
        return dialect
    if "input" in request or "output" in response:
        return "responses"
    if "choices" in response:
        return "chat"
    return "messages"


def build_outcome(
    trace: TrainingTrace | None, *, env_reward: float | None, timed_out: bool
) -> HarnessRolloutOutcome:
    """Build the outcome of one rollout from its captured trace and its verifier reward."""
    entries = trace.to_trace_entries() if trace is not None else []
    by_id = {(e.get("metadata") or {}).get("node_id"): e for e in entries}
    calls: dict[str, int] = {}
    names: dict[Any, str] = {}  # tool call id -> tool name, across turns
    verdicts: dict[Any, bool] = {}  # one per call: its id, or (tool, text, k) without one
    last: dict[str, Any] | None = None
    for entry in entries:
        metadata = entry.get("metadata") or {}
        if metadata.get("aux"):
            continue
        request, response = entry.get("request") or {}, entry.get("response") or {}
        reader = READERS[_shape_of(metadata, request, response)]
        for call_id, name in reader.calls(response):
            names[call_id] = name
            calls[name] = calls.get(name, 0) + 1
        repeats: dict[tuple[str, str], int] = {}
        for result in reader.results(request, names):
            key: Any = result.call_id
            if key is None:
                same = (result.name, result.text)
                repeats[same] = repeats.get(same, 0) + 1
                key = (*same, repeats[same])
            if key not in verdicts:
                verdicts[key] = (
                    result.failed if result.failed is not None else _text_says_failure(result.text)
                )
        last = entry
    failures = sum(verdicts.values())
    return HarnessRolloutOutcome(
        env_reward=env_reward,
        completion=_completion(last, by_id) if last is not None else [],
        trace=entries,
        tool_call_count=sum(calls.values()),
        tool_failure_count=failures,
        tool_calls_by_name=calls,
        timed_out=timed_out,
    )


def _shape_of(metadata: dict[str, Any], request: dict[str, Any], response: dict[str, Any]) -> str:
    if "message" in response or "n_messages" in request or "new_messages" in request:
        return "captured"
    return dialect_of(metadata, request, response)


def _completion(entry: dict[str, Any], by_id: dict[Any, dict[str, Any]]) -> list[Message]:
    """The turn's full transcript plus its reply, as chat messages."""
    metadata = entry.get("metadata") or {}
    request, response = entry.get("request") or {}, entry.get("response") or {}
    shape = _shape_of(metadata, request, response)
    if shape != "captured":
        reader = READERS[shape]
        return reader.transcript(request) + reader.reply(response)
    if "new_messages" in request and "messages" in request:  # the export's whole transcript
        return [dict(m) for m in request["messages"]] + Captured.reply(response)
    chain = [entry]
    parent = by_id.get(metadata.get("parent_id"))
    while parent is not None and parent not in chain:  # parents first; a cycle cannot loop us
        chain.insert(0, parent)
        parent = by_id.get((parent.get("metadata") or {}).get("parent_id"))
    messages: list[Message] = []
    for turn in chain:
        messages.extend(dict(m) for m in Captured.new_messages(turn.get("request") or {}))
        messages.extend(Captured.reply(turn.get("response") or {}))
    return messages


def _text_says_failure(text: str) -> bool:
    lowered = text.lower()
    return any(word in lowered for word in _FAILURE_WORDS)


def select_reward(rewards: dict[str, float], key: str | None, task_id: str) -> float | None:
    """The verifier reward to train on: `key` if given, else "reward", else the only key.

    A multi-reward task (reward.json with several keys) must name its key: picking one silently
    would train on a number nobody chose. Raises RewardMissingError (a verifier_failure)."""
    if not rewards:
        return None
    if key is not None:
        if key not in rewards:
            raise RewardMissingError(
                f"task {task_id} wrote rewards {sorted(rewards)} but not the selected key {key!r}; "
                "pick one of those with reward_key="
            )
        return rewards[key]
    if "reward" in rewards:
        return rewards["reward"]
    if len(rewards) == 1:
        return next(iter(rewards.values()))
    raise RewardMissingError(
        f"task {task_id} wrote several rewards {sorted(rewards)} and none is named 'reward'; "
        "choose one with reward_key="
    )
