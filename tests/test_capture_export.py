"""Export as a pure unit: every turn's ids and mask against an oracle, on a branched graph.

    .venv/bin/python -m pytest tests/test_capture_export.py -q

The export assembles each turn's prompt from per-node id texts and slices of a shared buffer of
zeros (capture/export.py), so these tests rebuild every turn the slow, obvious way from the full
prompts that were recorded and compare field by field, then let OpenEnv's own TrainingTrace
validate the JSON, whole and streamed.
"""

from __future__ import annotations

import asyncio
import math
from array import array

import pytest
from openenv.core.harness.training import TrainingTrace

from capture import export
from capture.calllog import CallLog, read_records
from capture.errors import NothingTrainableError
from capture.export import iter_trace_json, plan_export, trace_json
from capture.recorder import Capture
from capture.sampling import SamplingPolicy
from capture.sessions import Session
from capture.tokens import IdText


def record(session: Session, prompt: list[int], completion: list[int], *, n_tools: int = 1,
           logprobs: list[float] | None = None) -> str:
    call_id = session.next_call_id()
    lps = logprobs if logprobs is not None else [-0.1 * (i + 1) for i in range(len(completion))]
    capture = Capture(IdText.from_ids(prompt), array("i", completion), array("d", lps), {},
                      {"role": "assistant", "content": "x"}, "stop")
    missing = sum(1 for x in lps if math.isnan(x))
    session.record_ok(call_id, capture, {  # what capture.replies.finish_ok records
        "dialect": "chat", "n_tools": n_tools, "hint": "", "request": {"tools": []},
        "sampling": {}, "masked_logprobs": {"engine_sent_no_logprobs": missing} if missing else {}})
    return call_id


@pytest.fixture
def branched() -> tuple[Session, dict[str, tuple[list[int], list[int], list[float]]]]:
    """root -> a -> b, a -> c (a branch), a retry of b nobody continued, a second root, an aux."""
    session = Session("s", "secret", SamplingPolicy.from_dict(None))
    calls: dict[str, tuple[list[int], list[int], list[float]]] = {}

    def add(prompt, completion, **kw):
        call_id = record(session, prompt, completion, **kw)
        lps = kw.get("logprobs") or [-0.1 * (i + 1) for i in range(len(completion))]
        calls[call_id] = (prompt, completion, lps)
        return call_id

    root = [1, 2, 3, 4]
    add(root, [10, 11])
    a = [*root, 10, 11, 20, 21]
    add(a, [30])
    add([*a, 30, 40], [50, 51, 52], logprobs=[-0.5, math.nan, -0.7])  # b, one logprob missing
    add([*a, 30, 41, 42], [60])  # c: same parent, other branch
    add([*a, 30, 40], [55, 56, 57])  # a retry of b: nobody continues it, b continued below
    add([*a, 30, 40, 50, 51, 52, 70], [80])  # continues b
    add([100, 101], [102])  # an unrelated root (a subagent)
    add([7, 8], [9], n_tools=0)  # a tool-less call in a tool-using session: aux
    return session, calls


def test_every_turn_matches_the_oracle_and_validates(branched):
    session, calls = branched
    trace = TrainingTrace.model_validate_json(trace_json(session))
    plan = plan_export(session)
    assert plan.discarded  # the retry that nobody continued
    kept = [c for c in calls if c not in plan.discarded]
    assert [t.node_id for t in trace.turns] == kept
    for turn in trace.turns:
        prompt, completion, lps = calls[turn.node_id]
        assert turn.prompt_token_ids == prompt
        assert turn.completion_token_ids == completion
        assert turn.per_token_logps == [0.0 if math.isnan(x) else x for x in lps]
        aux = turn.metadata["aux"]
        assert turn.loss_mask == [0] * len(prompt) + [
            0 if aux or math.isnan(x) else 1 for x in lps]
    assert sum(t.metadata["aux"] for t in trace.turns) == 1


@pytest.mark.parametrize("piece_bytes", [1, 200, 1 << 20])
def test_the_streamed_export_is_the_same_json_in_pieces_of_any_size(branched, monkeypatch,
                                                                      piece_bytes):
    session, _ = branched
    monkeypatch.setattr(export, "EXPORT_PIECE_BYTES", piece_bytes)

    async def collect() -> list[bytes]:
        return [part async for part in iter_trace_json(plan_export(session))]

    pieces = asyncio.run(collect())
    assert b"".join(pieces) == trace_json(session)
    turns = len(plan_export(session).turns)
    expected = {1: turns + 1, 1 << 20: 1}  # a piece per turn and the tail, or all in one
    assert len(pieces) == expected.get(piece_bytes, len(pieces))
    assert 1 < len(pieces) <= turns + 1 or piece_bytes != 200


def test_a_restored_session_exports_the_same_trace(branched, tmp_path):
    session, _ = branched
    session.log = CallLog(tmp_path / "calls.jsonl", "never")
    replayed = Session("s", "secret", SamplingPolicy.from_dict(None))
    for node in session.graph:  # write what record_ok would have, then replay it
        session.log.append({"kind": "call", "node_id": node.node_id, "parent_id": node.parent_id,
                            "start": node.start, "seg": node.seg.tolist(),
                            "completion": node.completion.tolist(),
                            "logprobs": [None if math.isnan(x) else x for x in node.logprobs],
                            "info": node.info})
    session.log.close()
    records, torn = read_records(session.log.path)
    replayed.replay(records)
    assert torn == 0 and trace_json(replayed) == trace_json(session)


def test_a_session_with_only_aux_calls_says_why_instead_of_exporting_nothing():
    session = Session("s", "secret", SamplingPolicy.from_dict(None))
    record(session, [1, 2], [3], n_tools=0)
    record(session, [4, 5], [6], n_tools=1, logprobs=[math.nan])
    with pytest.raises(NothingTrainableError) as caught:
        trace_json(session)
    assert any("logprob" in reason for reason in caught.value.reasons)
