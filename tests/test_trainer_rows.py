"""TrainingTrace -> rows, and rows -> packed micro-batches.

Run: .venv/bin/python -m pytest tests/test_trainer_rows.py -q
"""

from __future__ import annotations

import pytest
import torch

from trainer.errors import CaptureError
from trainer.fakes import make_trace, make_turn
from trainer.packing import pack_rows
from trainer.rows import Row, trace_to_rows


def test_partial_mask_trains_tokens_20_and_22_and_keeps_21_as_context():
    trace = make_trace(make_turn([10, 11], [20, 21, 22], [-0.1, -0.2, -0.3], [1, 0, 1],
                                 node_id="a"))
    (row,), _ = trace_to_rows(trace)
    assert row.input_ids == [10, 11, 20, 21, 22]
    assert row.loss_mask == [0, 0, 1, 0, 1]
    # The masked token keeps its real logprob (provenance); it just does not train.
    assert row.behaviour_logprobs == [0.0, 0.0, -0.1, -0.2, -0.3]
    mbs, _ = pack_rows([row], [row.loss_mask], [1.0], budget=64)
    assert mbs[0].target_ids.tolist() == [20, 22]
    assert mbs[0].logit_index.tolist() == [1, 3]  # logits at 11 predict 20, at 21 predict 22


def test_a_fully_masked_completion_stays_as_context_and_in_usage_counts():
    trace = make_trace(
        make_turn([1, 2], [3, 4], completion_mask=[0, 0], node_id="title", aux=True),
        make_turn([1, 2, 3, 4, 5], [6], node_id="main"),
    )
    (row,), report = trace_to_rows(trace)
    assert row.input_ids == [1, 2, 3, 4, 5, 6]
    assert row.loss_mask == [0, 0, 0, 0, 0, 1]
    assert report.sampled_tokens == 3  # 3, 4 (masked) and 6 are all usage
    assert report.counts()["fully_masked_turn"] == 1


def test_a_turn_whose_prompt_extends_the_row_appends_to_it_with_the_gap_as_context():
    trace = make_trace(
        make_turn([1, 2], [3, 4], [-1.0, -2.0], node_id="t0"),
        make_turn([1, 2, 3, 4, 7, 8], [9], [-3.0], node_id="t1"),  # gap [7, 8]: tool result
    )
    rows, report = trace_to_rows(trace)
    assert len(rows) == 1 and report.new_rows_from_rewrites == 0
    assert rows[0].input_ids == [1, 2, 3, 4, 7, 8, 9]
    assert rows[0].loss_mask == [0, 0, 1, 1, 0, 0, 1]
    assert rows[0].behaviour_logprobs == [0.0, 0.0, -1.0, -2.0, 0.0, 0.0, -3.0]
    assert rows[0].node_ids == ["t0", "t1"]


def test_a_rewritten_history_starts_a_new_row_that_keeps_its_sampled_tokens_and_logprobs():
    trace = make_trace(
        make_turn([1, 2], [3, 4], [-1.0, -2.0], node_id="t0"),
        make_turn([1, 5, 6], [7, 8], [-0.5, -0.25], node_id="t1"),  # history rewritten at 2
    )
    rows, report = trace_to_rows(trace)
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4], [1, 5, 6, 7, 8]]
    assert rows[1].loss_mask == [0, 0, 0, 1, 1]
    assert rows[1].behaviour_logprobs[-2:] == [-0.5, -0.25]
    assert report.new_rows_from_rewrites == 1


def test_after_an_aux_call_the_next_main_turn_extends_the_longest_open_row():
    trace = make_trace(
        make_turn([1, 2], [3], node_id="main0"),
        make_turn([50, 51], [52], completion_mask=[0], node_id="aux"),  # title generator
        make_turn([1, 2, 3, 4], [5], node_id="main1"),
    )
    rows, _ = trace_to_rows(trace)
    assert [r.node_ids for r in rows] == [["main0", "main1"], ["aux"]]


def test_every_sampled_token_carries_the_versions_of_its_turn_and_context_carries_none():
    trace = make_trace(
        make_turn([1], [2, 3], node_id="a", version=4),
        make_turn([1, 2, 3, 9], [5], node_id="b", version=(4, 5)),  # straddled a sync
    )
    (row,), report = trace_to_rows(trace)
    assert row.version_start == [-1, 4, 4, -1, 4]
    assert row.version_end == [-1, 4, 4, -1, 5]
    assert report.straddled_turns == 1


def test_a_turn_without_versions_gets_the_dispatch_version_and_a_warning():
    trace = make_trace(make_turn([1], [2], node_id="a", version=None))
    (row,), report = trace_to_rows(trace, dispatch_version=7)
    assert row.version_start == [-1, 7]
    assert report.counts()["no_weight_version"] == 1


@pytest.mark.parametrize(
    ("turn", "code"),
    [
        ({"prompt_token_ids": [], "completion_token_ids": [1], "per_token_logps": [-1.0],
          "loss_mask": [1]}, "no_prompt_ids"),
        ({"prompt_token_ids": [1], "completion_token_ids": [2, 3], "per_token_logps": [-1.0],
          "loss_mask": [0, 1, 1]}, "logprob_misalign"),
        ({"prompt_token_ids": [1], "completion_token_ids": [2], "per_token_logps": [0.5],
          "loss_mask": [0, 1]}, "invalid_logprob"),
        ({"prompt_token_ids": [1], "completion_token_ids": [2], "per_token_logps": [-1.0],
          "loss_mask": [1, 1]}, "trainable_prompt"),
        ({"prompt_token_ids": [1], "completion_token_ids": [2], "per_token_logps": [-1.0],
          "loss_mask": [0]}, "length_mismatch"),
        ({"prompt_token_ids": [1, -3], "completion_token_ids": [2], "per_token_logps": [-1.0],
          "loss_mask": [0, 0, 1]}, "invalid_token_id"),
    ],
)
def test_a_malformed_capture_raises_capture_error_with_its_fatal_code(turn, code):
    with pytest.raises(CaptureError) as err:
        trace_to_rows({"turns": [{"node_id": "x", **turn}]}, rollout_id="r1")
    assert code in str(err.value) and "r1" in str(err.value)
    assert [f.code for f in err.value.findings] == [code]


def _row(n: int, trainable: int) -> Row:
    row = Row()
    row._append_context(list(range(100, 100 + n - trainable)))
    row._append_completion(list(range(trainable)), [1] * trainable, [-1.0] * trainable, 0, 0)
    return row


def test_packing_keeps_every_micro_batch_within_the_token_budget_and_restarts_positions():
    rows = [_row(n, 2) for n in (30, 20, 12, 9, 40)]
    mbs, stats = pack_rows(rows, [r.loss_mask for r in rows], [1.0] * 5, budget=41)
    assert all(mb.n_tokens <= 41 for mb in mbs)
    assert sum(mb.n_tokens for mb in mbs) == 111 and stats.rows_packed == 5
    for mb in mbs:
        starts = (mb.position_ids[0] == 0).sum().item()
        assert starts == mb.n_rows  # one restart per row, no padding anywhere


def test_token_normalisation_weights_sum_to_one_over_the_whole_step():
    rows = [_row(10, 3), _row(8, 5), _row(6, 1)]
    for norm in ("token", "sequence"):
        mbs, _ = pack_rows(rows, [r.loss_mask for r in rows], [1.0] * 3, budget=10, norm=norm)
        total = sum(mb.token_weight.sum().item() for mb in mbs)
        assert total == pytest.approx(1.0)


def test_a_row_over_the_budget_gets_its_own_micro_batch_and_is_counted():
    rows = [_row(50, 2), _row(5, 2)]
    mbs, stats = pack_rows(rows, [r.loss_mask for r in rows], [1.0, 1.0], budget=20)
    assert stats.over_budget_rows == 1 and len(mbs) == 2


def test_rows_with_nothing_trainable_are_not_forwarded_and_are_counted():
    rows = [_row(5, 0), _row(5, 2)]
    mbs, stats = pack_rows(rows, [r.loss_mask for r in rows], [1.0, 1.0], budget=20)
    assert stats.rows_context_only == 1 and sum(mb.n_rows for mb in mbs) == 1


def test_packed_logprobs_equal_per_row_logprobs_on_the_tiny_model(tiny_model_path):
    from transformers import AutoModelForCausalLM

    from trainer.forward import microbatch_logprobs, row_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    rows = []
    for n in (17, 9, 25):
        ids = torch.randint(10, 4000, (n,), generator=g).tolist()
        trace = make_trace(make_turn(ids[: n - 5], ids[n - 5:], node_id="x"))
        rows += trace_to_rows(trace)[0]
    alone = row_logprobs(model, rows, temperature=0.7)
    mbs, _ = pack_rows(rows, [r.loss_mask for r in rows], [0.0] * 3, budget=4096)
    assert len(mbs) == 1
    with torch.no_grad():
        packed, _ = microbatch_logprobs(model, mbs[0], 0.7)
    # pack_rows orders longest first: 25, 17, 9
    expected = alone[2] + alone[0] + alone[1]
    assert torch.allclose(packed, torch.tensor(expected), atol=1e-5)
