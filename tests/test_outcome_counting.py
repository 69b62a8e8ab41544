# .venv/bin/python -m pytest tests/test_outcome_counting.py -q
"""HarnessRolloutOutcome from traces of all three dialects: tool calls, failures, completion.

Traces are built by hand in each shape the outcome reads: our capture proxy's chat form (any
dialect, delta messages + parent links) and the raw wire shapes of chat, responses and messages.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

from openenv.core.harness.training import TrainingTrace

from harness.shared.outcome import HarnessRolloutOutcome, build_outcome


def _turn(node_id: str, request: dict, response: dict, **metadata: Any) -> dict[str, Any]:
    # 2 prompt ids + 1 completion id: the smallest turn TrainingTurn validates.
    return {
        "node_id": node_id,
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3],
        "per_token_logps": [-0.5],
        "loss_mask": [0, 0, 1],
        "request": request,
        "response": response,
        "metadata": metadata,
    }


def _trace(*turns: dict[str, Any]) -> TrainingTrace:
    return TrainingTrace.model_validate({"schema_version": 1, "turns": list(turns)})


def _call(call_id: str, name: str, args: dict | None = None) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(args or {})},
    }


# ---- our capture proxy's chat form ----------------------------------------------------------


def _captured_bash_session() -> TrainingTrace:
    # turn a: system + user -> two bash calls; turn b (child of a): two results -> one more call;
    # turn c (child of b): its result -> final answer. Plus an aux title call.
    return _trace(
        _turn(
            "title",
            {"messages": [{"role": "user", "content": "title?"}], "n_messages": 1},
            {"message": {"role": "assistant", "content": "A title"}},
            dialect="chat",
            aux=True,
            aux_reason="title",
            parent_id=None,
        ),
        _turn(
            "a",
            {
                "messages": [
                    {"role": "system", "content": "sys"},
                    {"role": "user", "content": "fix it"},
                ],
                "n_messages": 2,
            },
            {
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [_call("c1", "bash"), _call("c2", "bash")],
                }
            },
            dialect="chat",
            aux=False,
            parent_id=None,
        ),
        _turn(
            "b",
            {
                "messages": [
                    {
                        "role": "tool",
                        "tool_call_id": "c1",
                        "content": '{"returncode": 0, "output": "ok"}',
                    },
                    {
                        "role": "tool",
                        "tool_call_id": "c2",
                        "content": '{"returncode": 2, "output": "no"}',
                    },
                ],
                "n_messages": 5,
            },
            {"message": {"role": "assistant", "content": "", "tool_calls": [_call("c3", "edit")]}},
            dialect="chat",
            aux=False,
            parent_id="a",
        ),
        _turn(
            "c",
            {
                "messages": [
                    {
                        "role": "tool",
                        "tool_call_id": "c3",
                        "content": "Traceback (most recent call last)",
                    },
                ],
                "n_messages": 7,
            },
            {"message": {"role": "assistant", "content": "done"}},
            dialect="chat",
            aux=False,
            parent_id="b",
        ),
    )


def test_the_outcome_has_exactly_trls_field_names_in_trls_order():
    # Read TRL's dataclass from its source: importing trl.experimental pulls torch + accelerate
    # (~60 s on a busy 2-core CI machine) for a list of seven names.
    spec = importlib.util.find_spec("trl")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "experimental" / "async_grpo" / "openenv_harness.py"
    tree = ast.parse(source.read_text())
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "HarnessRolloutOutcome"
    )
    trl_fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]
    assert [f.name for f in dataclasses.fields(HarnessRolloutOutcome)] == trl_fields


def test_captured_tool_calls_are_counted_by_name_over_non_aux_turns():
    outcome = build_outcome(_captured_bash_session(), env_reward=0.0, timed_out=False)
    # a: bash, bash; b: edit; c: none; the aux title turn has none -> 3 calls
    assert outcome.tool_calls_by_name == {"bash": 2, "edit": 1}
    assert outcome.tool_call_count == 3


def test_captured_failures_come_from_the_exit_code_record_and_the_failure_words():
    outcome = build_outcome(_captured_bash_session(), env_reward=0.0, timed_out=False)
    # c1 returncode 0 -> ok; c2 returncode 2 -> failure (record); c3 "Traceback" -> failure (text)
    assert outcome.tool_failure_count == 2


def test_captured_completion_is_the_full_transcript_rebuilt_through_the_parents():
    outcome = build_outcome(_captured_bash_session(), env_reward=1.0, timed_out=False)
    roles = [m["role"] for m in outcome.completion]
    # a: system, user, assistant; b: tool, tool, assistant; c: tool, assistant("done")
    assert roles == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    assert outcome.completion[-1]["content"] == "done"


def test_the_proxy_rendering_of_an_anthropic_is_error_counts_as_the_agents_own_failure_record():
    trace = _trace(
        _turn(
            "a",
            {"messages": [{"role": "user", "content": "go"}], "n_messages": 1},
            {"message": {"role": "assistant", "content": "", "tool_calls": [_call("t1", "Bash")]}},
            dialect="messages",
            parent_id=None,
        ),
        _turn(
            "b",
            {
                "messages": [
                    {
                        "role": "tool",
                        "tool_call_id": "t1",
                        "content": "[tool error] permission denied",
                    }
                ],
                "n_messages": 3,
            },
            {"message": {"role": "assistant", "content": "ok"}},
            dialect="messages",
            parent_id="a",
        ),
    )
    outcome = build_outcome(trace, env_reward=None, timed_out=True)
    assert outcome.tool_failure_count == 1
    assert outcome.timed_out is True and outcome.env_reward is None


def test_a_failure_resent_in_every_later_request_is_counted_once():
    same = {"role": "tool", "tool_call_id": "c1", "content": "command failed"}
    trace = _trace(
        *[
            _turn(
                f"n{i}",
                {
                    "messages": [
                        {"role": "assistant", "content": "", "tool_calls": [_call("c1", "bash")]},
                        same,
                    ]
                },
                {"choices": [{"message": {"role": "assistant", "content": "again"}}]},
                dialect="chat",
            )
            for i in range(3)
        ]
    )
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 1


def test_the_same_text_from_two_different_tools_counts_twice():
    trace = _trace(
        _turn(
            "a",
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [_call("c1", "bash"), _call("c2", "python")],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": "Error: nope"},
                    {"role": "tool", "tool_call_id": "c2", "content": "Error: nope"},
                ]
            },
            {"choices": [{"message": {"role": "assistant", "content": ""}}]},
            dialect="chat",
        )
    )
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 2


def test_failure_words_match_in_any_case_and_clean_output_does_not_count():
    texts = ["EXCEPTION raised", "Build FAILED", "all good", "exit 0, wrote 3 files"]
    messages: list[dict] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call(f"c{i}", "bash") for i in range(len(texts))],
        }
    ]
    messages += [
        {"role": "tool", "tool_call_id": f"c{i}", "content": t} for i, t in enumerate(texts)
    ]
    trace = _trace(
        _turn(
            "a",
            {"messages": messages},
            {"choices": [{"message": {"role": "assistant", "content": ""}}]},
            dialect="chat",
        )
    )
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 2


# ---- raw wire shapes (traces from other producers) ------------------------------------------


def test_raw_chat_shape_counts_calls_from_choices_and_builds_the_completion():
    trace = _trace(
        _turn(
            "a",
            {"messages": [{"role": "user", "content": "hi"}]},
            {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [_call("c1", "bash")],
                        }
                    }
                ]
            },
            dialect="chat",
        )
    )
    outcome = build_outcome(trace, env_reward=0.0, timed_out=False)
    assert outcome.tool_calls_by_name == {"bash": 1}
    assert [m["role"] for m in outcome.completion] == ["user", "assistant"]


def test_raw_responses_shape_counts_function_calls_and_failed_outputs():
    request = {
        "instructions": "be brief",
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "function_call", "call_id": "f1", "name": "exec_command", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "f1",
                "output": json.dumps({"output": "x", "metadata": {"exit_code": 1}}),
            },
            {"type": "function_call", "call_id": "f2", "name": "exec_command", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "f2",
                "output": {"content": "fine", "success": False},
            },
            {
                "type": "custom_tool_call",
                "call_id": "f3",
                "name": "apply_patch",
                "input": "*** Begin",
            },
            {"type": "custom_tool_call_output", "call_id": "f3", "output": "Done!"},
        ],
    }
    response = {
        "output": [
            {"type": "function_call", "call_id": "f4", "name": "exec_command", "arguments": "{}"},
            {"type": "reasoning", "summary": []},
        ]
    }
    outcome = build_outcome(
        _trace(_turn("a", request, response, dialect="responses")), env_reward=0.0, timed_out=False
    )
    assert outcome.tool_calls_by_name == {"exec_command": 1}  # calls are counted in responses
    # f1: exit_code 1 (record); f2: success false (record); f3: "Done!" -> 2 failures
    assert outcome.tool_failure_count == 2
    assert outcome.completion[0] == {"role": "system", "content": "be brief"}
    assert outcome.completion[-1]["tool_calls"][0]["function"]["name"] == "exec_command"


def test_raw_messages_shape_trusts_is_error_and_names_results_by_tool_use_id():
    request = {
        "system": [{"type": "text", "text": "sys"}],
        "messages": [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "file body",
                        "is_error": True,
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": [{"type": "text", "text": "ok"}],
                    },
                ],
            },
        ],
    }
    response = {
        "content": [
            {"type": "text", "text": "done"},
            {"type": "tool_use", "id": "t3", "name": "Write", "input": {"a": 1}},
        ]
    }
    outcome = build_outcome(
        _trace(_turn("a", request, response, dialect="messages")), env_reward=1.0, timed_out=False
    )
    assert outcome.tool_calls_by_name == {"Write": 1}
    assert outcome.tool_failure_count == 1  # t1: is_error although its text is clean
    roles = [m["role"] for m in outcome.completion]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert outcome.completion[3]["name"] == "Read"


def test_no_trace_gives_an_empty_outcome_that_keeps_the_reward_and_the_timeout_flag():
    outcome = build_outcome(None, env_reward=None, timed_out=True)
    assert (outcome.completion, outcome.trace, outcome.tool_call_count) == ([], [], 0)
    assert outcome.timed_out is True and outcome.env_reward is None


# ---- per call, explicit status first (issue 15 item 4) ------------------------------------------


def _chat_request_turn(node_id: str, messages: list[dict]) -> dict[str, Any]:
    return _turn(
        node_id,
        {"messages": messages},
        {"choices": [{"message": {"role": "assistant", "content": ""}}]},
        dialect="chat",
    )


def test_identical_failures_of_different_calls_each_count():
    # Two bash calls failing with the same text are two failures (once: one, keyed by text).
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [_call("c1", "bash"), _call("c2", "bash")],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "command failed"},
        {"role": "tool", "tool_call_id": "c2", "content": "command failed"},
    ]
    # ... and resending both in a later request adds nothing.
    trace = _trace(_chat_request_turn("a", messages), _chat_request_turn("b", messages))
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 2


def test_identical_failures_without_call_ids_count_per_occurrence_not_per_request():
    results = [{"role": "tool", "name": "bash", "content": "Error: disk"}] * 3
    trace = _trace(
        _chat_request_turn("a", results[:2]),  # two failures so far
        _chat_request_turn("b", results),  # the same two resent, plus a third
    )
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 3


def test_an_explicit_exit_status_wins_over_the_failure_words():
    calls = [_call(f"c{i}", "bash") for i in range(4)]
    messages = [
        {"role": "assistant", "content": "", "tool_calls": calls},
        # exit 0, although the output reads like an error: a success
        {
            "role": "tool",
            "tool_call_id": "c0",
            "content": '{"returncode": 0, "output": "0 errors"}',
        },
        {"role": "tool", "tool_call_id": "c1", "content": "<returncode>0</returncode> FAILED=0"},
        # exit 1 with clean-looking output: a failure
        {"role": "tool", "tool_call_id": "c2", "content": '{"returncode": 1, "output": "ok"}'},
        # no record: the words decide
        {"role": "tool", "tool_call_id": "c3", "content": "Traceback: boom"},
    ]
    trace = _trace(_chat_request_turn("a", messages))
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 2


def test_explicit_success_records_of_responses_and_messages_win_over_the_words():
    responses = {
        "input": [
            {"type": "function_call", "call_id": "f1", "name": "exec_command", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "f1",
                "output": {"content": "no error found", "success": True},
            },
            {"type": "function_call", "call_id": "f2", "name": "exec_command", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "f2",
                "output": json.dumps(
                    {"output": "Exception count: 0", "metadata": {"exit_code": 0}}
                ),
            },
        ]
    }
    messages = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash"}]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": "failed: 0",
                        "is_error": False,
                    },
                ],
            },
        ]
    }
    trace = _trace(
        _turn("a", responses, {"output": []}, dialect="responses"),
        _turn("b", messages, {"content": []}, dialect="messages"),
    )
    assert build_outcome(trace, env_reward=0.0, timed_out=False).tool_failure_count == 0


def test_the_verifier_output_tail_is_kept_from_the_trial_dir(tmp_path) -> None:
    # Harbor writes the grader's streams into the trial dir, which close() deletes: the record
    # keeps their tails, so a run shows why a rollout got its grade.
    from harness.service.session_grading import VERIFIER_OUTPUT_CHARS, verifier_output

    assert verifier_output(tmp_path) is None
    (tmp_path / "verifier").mkdir()
    (tmp_path / "verifier" / "test-stdout.txt").write_text("x" * 20000 + "1 passed")
    (tmp_path / "verifier" / "test-stderr.txt").write_text("warning: slow")
    out = verifier_output(tmp_path)
    assert out is not None and out.endswith("1 passed\nwarning: slow")
    assert len(out) == VERIFIER_OUTPUT_CHARS + 1 + len("warning: slow")
