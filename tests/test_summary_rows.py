"""A summary call (an agent compacting its history) is context unless `train_summary_calls`.

    nice -n 15 .venv/bin/python -m pytest tests/test_summary_rows.py -q

The capture records what happened (the summarizer call, aux, loss mask all zero: capture.aux);
the trainer decides (trainer/rows.py). The trace, by hand, as opencode's compaction makes it:

    a   root          prompt [1,2]          completion [3,4]      the agent's first turn
    b   extends a     prompt [1,2,3,4,5]    completion [6]
    s   summarizer    prompt [50,51]        completion [52,53,54] aux (its own system prompt)
    c   rewritten     prompt [1,2,60]       completion [61,62]    the history: task + summary
    d   extends c     prompt [1,2,60,61,62,63] completion [64]

Rows: [a, b] (one window), [s], [c, d] (the window after the compaction). Trained tokens, off:
a 2 + b 1 + c 2 + d 1 = 6; on: + s 3 = 9.
"""

from __future__ import annotations

from typing import Any

import pytest

from trainer.groups import prepare_group
from trainer.rows import trace_to_rows


def _turn(node: str, prompt: list[int], completion: list[int], *,
          aux_reason: str | None = None, **metadata: Any) -> dict:
    aux = aux_reason is not None
    return {"node_id": node, "prompt_token_ids": prompt, "completion_token_ids": completion,
            "per_token_logps": [-0.25] * len(completion),
            "loss_mask": [0] * len(prompt) + [0 if aux else 1] * len(completion),
            "metadata": {"aux": aux, "aux_reason": aux_reason, "weight_version_start": 0,
                         "weight_version_end": 0, **metadata}}


def compacted_trace(**summary_metadata: Any) -> dict:
    return {"schema_version": 1, "turns": [
        _turn("a", [1, 2], [3, 4], join="new_root"),
        _turn("b", [1, 2, 3, 4, 5], [6], join="extended"),
        _turn("s", [50, 51], [52, 53, 54], aux_reason="summarizer", join="new_root",
              **summary_metadata),
        _turn("c", [1, 2, 60], [61, 62], join="rewritten"),
        _turn("d", [1, 2, 60, 61, 62, 63], [64], join="extended"),
    ]}


def test_by_default_the_summary_call_is_context_and_each_window_is_its_own_row() -> None:
    rows, report = trace_to_rows(compacted_trace(), rollout_id="r")
    assert [row.node_ids for row in rows] == [["a", "b"], ["s"], ["c", "d"]]
    assert [row.n_trainable for row in rows] == [3, 0, 3]  # 6 = a 2 + b 1, c 2 + d 1
    assert report.trainable_tokens == 6 and report.sampled_tokens == 9
    assert "summary_call_trained" not in report.counts()


def test_with_train_summary_calls_the_summary_trains_its_sampled_tokens_once() -> None:
    rows, report = trace_to_rows(compacted_trace(), rollout_id="r", train_summary_calls=True)
    assert [row.node_ids for row in rows] == [["a", "b"], ["s"], ["c", "d"]]
    (summary_row,) = [row for row in rows if row.node_ids == ["s"]]
    # its prompt [50, 51] context, its completion [52, 53, 54] trained with its logprobs
    assert summary_row.input_ids == [50, 51, 52, 53, 54]
    assert summary_row.loss_mask == [0, 0, 1, 1, 1]
    assert summary_row.behaviour_logprobs[2:] == [-0.25] * 3
    assert report.trainable_tokens == 9  # 6 + the summary's 3
    assert report.counts()["summary_call_trained"] == 1


def test_a_title_call_stays_context_even_with_train_summary_calls() -> None:
    trace = compacted_trace()
    trace["turns"][2]["metadata"]["aux_reason"] = "title_generator"
    _, report = trace_to_rows(trace, rollout_id="r", train_summary_calls=True)
    assert report.trainable_tokens == 6


def test_a_summary_with_tokens_without_a_logprob_stays_context_and_is_counted() -> None:
    trace = compacted_trace(masked_logprobs={"missing": 1})
    _, report = trace_to_rows(trace, rollout_id="r", train_summary_calls=True)
    assert report.trainable_tokens == 6
    assert report.counts()["summary_call_not_trainable"] == 1


class _Result:
    """A finished rollout as prepare_group reads it: cause, trace, the verifier's reward."""

    def __init__(self, episode: str, reward: float) -> None:
        self.episode_id, self.trace, self.env_reward = episode, compacted_trace(), reward
        self.cause = "ok"


@pytest.mark.parametrize("on", [False, True])
def test_the_summary_row_gets_the_rollouts_advantage_when_trained(on: bool) -> None:
    results = [_Result("r0", 1.0), _Result("r1", 0.0)]
    group = prepare_group(results, group_index=0, reward_funcs=[],
                          scale_rewards=False, dispatch_version=0, train_summary_calls=on)
    # rewards 1 and 0: advantages +0.5 and -0.5; every row of a rollout gets its rollout's
    summary_rows = [(row, a) for row, a in zip(group.rows, group.row_advantages, strict=True)
                    if row.node_ids == ["s"]]
    assert [a for _, a in summary_rows] == [0.5, -0.5]
    assert [row.n_trainable for row, _ in summary_rows] == ([3, 3] if on else [0, 0])


def test_the_run_setting_reaches_the_trainer_and_is_off_by_default() -> None:
    from harness.shared.run_config import build_parser, settings_from_args

    on = settings_from_args(build_parser("t", "d"), ["--train-summary-calls"])
    off = settings_from_args(build_parser("t", "d"), [])
    assert on.trainer_config().train_summary_calls is True
    assert off.trainer_config().train_summary_calls is False
