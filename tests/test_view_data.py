"""The viewer's reading of a run directory and its HTTP answers, without a browser.

Run: .venv/bin/python -m pytest tests/test_view_data.py -q

Each test attacks one property: the index never opens a rollout file (10,000 rollouts in well
under 2 s, and it still works with the rollout files gone); a running run's appended lines show on
the next request and a torn line costs that line alone; a rewritten history becomes a branch; the
loss mask and the new prompt tokens line up with the ids; what the run did not record is None,
never 0; NaN in a record still gives valid JSON; bad input gets a clear error; a train run's own
held-out before/after and its eval rollouts are served beside its training rollouts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from bench.view.bench import generate
from harness.eval import pass_rate_table
from harness.run.learning import before_after_table
from harness.view.data import JsonlTail, RunData
from harness.view.server import ViewServer
from harness.view.turns import turns_view


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_ten_thousand_rollouts_index_without_opening_a_rollout_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    generate(run, 10_000, traces=False)  # the index must not need the rollout files
    assert not any((run / "rollouts").iterdir())
    # How fast is bench/view/bench.py's job (timed tests fail on a busy machine); this test checks
    # the property that makes it fast: the index needs no rollout file.
    data = RunData(run)
    rows = data.rollouts()
    summary = data.run()
    assert len(rows) == 10_000 and summary["n_rollouts"] == 10_000
    assert sum(summary["causes"].values()) == 10_000
    with ViewServer(RunData(run), port=0) as server:
        status, body = _get(server.url + "api/rollouts")
    assert status == 200 and len(body["rollouts"]) == 10_000


def test_a_running_run_shows_appended_lines_and_survives_a_torn_one(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    tail = JsonlTail(path)
    assert tail.read() == []  # not written yet: empty, not an error
    path.write_text(json.dumps({"index": 0}) + "\n" + '{"index": 1, "cau')
    assert [r["index"] for r in tail.read()] == [0]  # the half-written line waits
    with path.open("a") as f:
        f.write('se": "ok"}\n{not json}\n' + json.dumps({"index": 2}) + "\n")
    assert [r["index"] for r in tail.read()] == [0, 1, 2]
    assert tail.bad_lines == 1
    path.write_text(json.dumps({"index": 7}) + "\n")  # rewritten (shorter): read again
    assert [r["index"] for r in tail.read()] == [7]


def _turn(node: str, parent: str | None, prompt: list[int], completion: list[int], *,
          aux: bool = False, n_new: int | None = None) -> dict:
    metadata = {"parent_id": parent, "aux": aux, "dialect": "chat"}
    if n_new is not None:
        metadata["n_new_prompt_tokens"] = n_new
    return {"node_id": node, "prompt_token_ids": prompt, "completion_token_ids": completion,
            "per_token_logps": [-0.5] * len(completion),
            "loss_mask": [0] * len(prompt) + [0 if aux else 1] * len(completion),
            "request": {"new_messages": [{"role": "user", "content": node}]},
            "response": {"choices": [{"message": {"role": "assistant", "content": "r" + node}}]},
            "metadata": metadata}


def test_a_rewritten_history_is_a_branch_and_masks_line_up() -> None:
    turns = turns_view([
        _turn("t", None, [1, 2], [3], aux=True),  # a title call: its own root
        _turn("a", None, [10, 11], [12, 13]),
        _turn("b", "a", [10, 11, 12, 13, 14], [15]),  # extends a: no n_new recorded
        _turn("c", "a", [10, 11, 12, 13, 99, 98], [16, 17], n_new=2),  # a's 2nd child: rewritten
        _turn("d", "c", [10, 11, 12, 13, 99, 98, 16, 17, 5], [6]),
    ])
    by = {t["node_id"]: t for t in turns}
    assert by["t"]["aux"] and by["t"]["n_trained"] == 0
    assert [tok[3] for tok in by["t"]["tokens"]] == [0]
    assert by["a"]["forks_from"] == -1 and by["a"]["branch"] != by["t"]["branch"]  # a new root
    assert by["b"]["branch"] == by["a"]["branch"] and by["b"]["forks_from"] is None
    assert by["c"]["forks_from"] == 1 and by["c"]["branch"] not in (by["a"]["branch"],
                                                                   by["t"]["branch"])
    assert by["d"]["branch"] == by["c"]["branch"] and by["d"]["depth"] == 2
    assert [tok[0] for tok in by["b"]["prompt_new_tokens"]] == [14]  # found by prefix
    assert [tok[0] for tok in by["c"]["prompt_new_tokens"]] == [99, 98]  # as recorded
    assert [(tok[0], tok[3]) for tok in by["c"]["tokens"]] == [(16, 1), (17, 1)]
    assert all(tok[3] == 0 for t in turns for tok in t["prompt_new_tokens"])
    assert by["c"]["reply"]["content"] == "rc" and by["c"]["new_messages"][0]["content"] == "c"


def test_what_the_run_did_not_record_is_none_never_zero(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))  # no tiny model built there
    run = tmp_path / "run"
    generate(run, 16)
    (run / "trainer" / "groups.jsonl").unlink()  # e.g. a run stopped before its first step
    data = RunData(run)
    assert all(r["advantage"] is None and r["reward"] is None and r["step"] is None
               for r in data.rollouts())
    one = data.rollout(3)
    assert one["trained"] is None and one["group"] is None
    assert one["tokenizer"].startswith("no tokenizer found")  # ids shown, and it says why
    assert all(tok[1] is None for t in one["turns"] for tok in t["tokens"])


def test_nan_in_a_record_still_gives_json_and_errors_are_clear(tmp_path: Path) -> None:
    run = tmp_path / "run"
    generate(run, 8)
    path = next((run / "rollouts").glob("00002-*.json"))
    record = json.loads(path.read_text())
    record["env_reward"] = float("nan")
    record["timings"]["total"] = float("inf")
    path.write_text(json.dumps(record))  # Python writes NaN / Infinity, which JSON lacks
    with ViewServer(RunData(run), port=0) as server:
        status, body = _get(server.url + "api/rollout/2")
        assert status == 200 and body["env_reward"] is None and body["timings"]["total"] is None
        status, body = _get(server.url + "api/rollout/99")
        assert status == 404 and "no rollout 99" in body["error"]
        status, body = _get(server.url + "api/compare")
        assert status == 404 and "--compare" in body["error"]
        status, body = _get(server.url + "api/run?run=b")
        assert status == 404 and "--compare" in body["error"]


def test_the_command_refuses_a_missing_run_dir_clearly(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    run = subprocess.run([sys.executable, "-m", "harness.view", str(missing), "--port", "0"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert f"run directory {missing} does not exist" in run.stderr
    assert "--output-dir" in run.stderr


def test_every_asset_the_page_loads_is_served(tmp_path: Path) -> None:
    import re

    generate(tmp_path / "run", 8)
    with ViewServer(RunData(tmp_path / "run"), port=0) as server:
        with urllib.request.urlopen(server.url, timeout=30) as r:
            html = r.read().decode()
        assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', html)
        assert len(assets) == 5, assets
        for asset in assets:
            with urllib.request.urlopen(server.url.rstrip("/") + asset, timeout=30) as r:
                assert r.status == 200 and len(r.read()) > 500
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(server.url + "static/..%2Fdata.py", timeout=30)


def test_the_trainer_records_each_rollouts_advantage_in_its_own_place(tmp_path: Path) -> None:
    """trainer/groups.py's records, which the rollout page shows: an unscorable rollout between
    two scored ones keeps its None and does not shift the others' advantages."""
    import random

    from trainer.fakes import synthetic_trace
    from trainer.groups import append_group_records, prepare_group
    from trainer.rollouts import Rollout

    rng = random.Random(0)
    results = [Rollout(cause="ok", episode_id="e0", env_reward=1.0, trace=synthetic_trace(rng)),
               Rollout(cause="infra_failure", episode_id="e1"),
               Rollout(cause="model_failure", episode_id="e2", env_reward=0.0,
                       trace=synthetic_trace(rng))]
    group = prepare_group(results, group_index=4, reward_funcs=[], scale_rewards=True,
                          dispatch_version=0)
    append_group_records(tmp_path / "trainer" / "groups.jsonl", 2, [group])
    line = json.loads((tmp_path / "trainer" / "groups.jsonl").read_text())
    assert (line["step"], line["group_index"], line["skipped"]) == (2, 4, None)
    by = {r["episode_id"]: r for r in line["rollouts"]}
    assert by["e1"] == {"episode_id": "e1", "reward": None, "parts": {}, "advantage": None}
    assert by["e0"]["advantage"] == pytest.approx(1.0, abs=1e-3)
    assert by["e2"]["advantage"] == pytest.approx(-1.0, abs=1e-3)
    assert by["e0"]["parts"] == {"env_reward": 1.0}
    data = RunData(tmp_path)
    (tmp_path / "rollouts.jsonl").write_text("".join(
        json.dumps({"index": i, "task_id": "t", "episode_id": f"e{i}", "cause": "ok"}) + "\n"
        for i in range(3)))
    assert [r["advantage"] for r in data.rollouts()] == [by["e0"]["advantage"], None,
                                                          by["e2"]["advantage"]]


def _eval_side(run: Path, side: str, seed: int) -> list[dict]:
    """<run>/<side> as harness.run.learning's evaluate_split writes it: the index, the rollout files
    and eval_summary.json, nothing of the trainer's (the rollouts come from bench/view's
    generator, one per task)."""
    source = run.parent / f"{side}-source"
    generate(source, 8, num_generations=1, seed=seed)
    (run / side).mkdir()
    shutil.copytree(source / "rollouts", run / side / "rollouts")
    shutil.copy(source / "rollouts.jsonl", run / side / "rollouts.jsonl")
    records = [json.loads(line) for line in (source / "rollouts.jsonl").read_text().splitlines()]
    (run / side / "eval_summary.json").write_text(json.dumps(pass_rate_table(records)[1]))
    return records


def test_a_train_run_serves_its_own_before_after_and_eval_rollouts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    generate(run, 16)
    data = RunData(run)
    assert data.run()["before_after"] is None and data.run()["sides"] == {"train": 16}
    before = _eval_side(run, "eval-before", seed=1)
    after = _eval_side(run, "eval-after", seed=2)
    table, written = before_after_table(pass_rate_table(before)[1], pass_rate_table(after)[1])
    written.update(eval_tasks="family:test", shuffled_rewards=False, seed=0)
    (run / "before_after.json").write_text(json.dumps(written))
    with ViewServer(RunData(run), port=0) as server:
        status, body = _get(server.url + "api/run")
        assert status == 200 and body["kind"] == "train"
        assert body["before_after"] == written  # per task, overall and the change, as written
        assert body["sides"] == {"train": 16, "eval-before": 8, "eval-after": 8}
        assert body["n_rollouts"] == 16  # the run's plots count its training rollouts only

        status, body = _get(server.url + "api/rollouts")
        by_side: dict[str, list[dict]] = {}
        for row in body["rollouts"]:
            by_side.setdefault(row["side"], []).append(row)
        assert {k: len(v) for k, v in by_side.items()} == {"train": 16, "eval-before": 8,
                                                           "eval-after": 8}
        for side, records in (("eval-before", before), ("eval-after", after)):
            rows = by_side[side]
            assert [(r["index"], r["task_id"], r["env_reward"]) for r in rows] == \
                [(r["index"], r["task_id"], r["env_reward"]) for r in records]
            assert all(r["step"] is None and r["advantage"] is None for r in rows)  # not trained

        # Index 3 exists on every side: the side says which one is opened, turn by turn.
        opened = {}
        for side in ("", "train", "eval-before", "eval-after"):
            status, one = _get(server.url + f"api/rollout/3?side={side}")
            assert status == 200, one
            opened[side] = one
        assert opened[""]["episode_id"] == opened["train"]["episode_id"]
        assert opened["train"]["side"] == "train" and opened["train"]["trained"] is not None
        for side, records in (("eval-before", before), ("eval-after", after)):
            one = opened[side]
            assert (one["side"], one["episode_id"]) == (side, records[3]["episode_id"])
            assert one["trained"] is None and one["group"] is None and one["turns"]
            assert one["turns"][0]["tokens"] and one["turns"][0]["new_messages"]
        status, body = _get(server.url + "api/rollout/3?side=eval-sideways")
        assert status == 404 and "no side 'eval-sideways'" in body["error"]
        assert "eval-before" in body["error"]
        status, body = _get(server.url + "api/rollout/99?side=eval-after")
        assert status == 404 and "no rollout 99" in body["error"]


def test_the_first_call_after_a_compaction_is_marked_with_the_summary_call_it_carries() -> None:
    summary = "Summary so far: the numbers were listed three times; next write done.txt."
    summarizer = _turn("s", None, [1, 2, 3], [4, 5], aux=True)
    summarizer["metadata"]["aux_reason"] = "summarizer"
    # Claude Code's shape: it carries on only the <summary> block (capture.placement.summary_body)
    summarizer["response"]["choices"][0]["message"]["content"] = (
        f"<analysis>Looked at the runs.</analysis>\n<summary>\n{summary}\n</summary>")
    after = _turn("c", None, [7, 8], [9])  # a new root whose messages hold the summary
    after["metadata"]["join"] = "rewritten"
    after["request"]["new_messages"] = [{"role": "user", "content": "Task."},
                                        {"role": "user", "content": f"Summary:\n{summary}"}]
    other = _turn("x", None, [20], [21])  # rewritten too, but it carries no summary
    other["metadata"]["join"] = "rewritten"
    turns = turns_view([_turn("a", None, [1, 2], [3]), summarizer, after,
                        _turn("d", "c", [7, 8, 9, 10], [11]), other])
    assert [t["compacted_by"] for t in turns] == [None, None, 1, None, None]
