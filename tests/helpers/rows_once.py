"""The "trained exactly once" check shared by the thinking and joins tests (issue 34, part 2).

A trace's rows (trainer/rows.py) must hold every call's tokens exactly as the engine saw and
produced them, in the context it was sampled in, and train each sampled token once.
"""

from __future__ import annotations

from trainer.rows import Row, trace_to_rows


def check_trained_once(trace: dict) -> list[Row]:
    """Assert, for one trace: (1) each row, up to the end of each call it holds, is exactly that
    call's engine prompt + completion; (2) total trained tokens = total sampled by agent calls
    (aux calls, a title or a summary, are context only), a row's trained tokens are its calls'
    completions in order, every call is in exactly one row. Returns the rows."""
    turns = {t["node_id"]: t for t in trace["turns"]}
    rows, report = trace_to_rows(trace, rollout_id="r")
    assert not report.fatal
    for turn in turns.values():  # an agent turn trains every sampled token; an aux call none
        mask = turn["loss_mask"][len(turn["prompt_token_ids"]):]
        assert mask == [0 if turn["metadata"]["aux"] else 1] * len(turn["completion_token_ids"])
    sampled = sum(len(t["completion_token_ids"]) for t in turns.values())
    to_train = sum(len(t["completion_token_ids"]) for t in turns.values()
                   if not t["metadata"]["aux"])
    assert sum(row.n_trainable for row in rows) == to_train
    assert report.sampled_tokens == sampled
    assert sorted(n for row in rows for n in row.node_ids) == sorted(turns)  # each call once
    for row in rows:
        trained: list[int] = []
        for node in row.node_ids:
            turn = turns[node]
            seen = turn["prompt_token_ids"] + turn["completion_token_ids"]
            assert row.input_ids[:len(seen)] == seen, f"{node}: not the engine's tokens"
            trained += [] if turn["metadata"]["aux"] else turn["completion_token_ids"]
        assert [t for t, m in zip(row.input_ids, row.loss_mask, strict=True) if m] == trained
    return rows
