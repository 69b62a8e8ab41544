# Run: .venv/bin/python -m pytest tests/test_learning_instruments.py -x -q
"""The instruments of a learning run (issue 18): the shuffled-reward control, the reward curve
(JSON + PNG), the before/after pass-rate table and its settings, and the held-out evaluation
itself through a real mini-swe-agent, a real capture proxy and the family's real verifiers, with
a scripted engine choosing every reply (nothing depends on what the tiny model samples)."""

from __future__ import annotations

import json
import math
import random
import re
import struct
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.run.learning import (
    before_after_problems,
    before_after_table,
    evaluate_split,
    write_reward_curve,
)
from harness.service.preflight import eval_task_problems
from harness.shared.run_config import RunSettings, build_parser, settings_from_args
from harness.tasks.family import FAMILY_DIR, family_tasks
from trainer.fakes import synthetic_trace
from trainer.groups import group_metrics, prepare_group
from trainer.reward_shuffle import RewardShuffle
from trainer.rollouts import Rollout, RolloutOutcome


def _rollout(reward: float | None, cause: str = "ok", seed: int = 0) -> Rollout:
    outcome = RolloutOutcome(env_reward=reward, completion=[], trace=[], tool_call_count=1,
                             tool_failure_count=0, tool_calls_by_name={"bash": 1},
                             timed_out=False)
    return Rollout(cause=cause, trace=synthetic_trace(random.Random(seed)), outcome=outcome,
                   env_reward=reward, episode_id=f"e{seed}")


def _group(rewards: list[float | None], index: int, shuffle_seed: int | None, causes=None):
    causes = causes or ["ok"] * len(rewards)
    results = [_rollout(r, cause=c, seed=i) if c != "infra_failure"
               else Rollout(cause=c, error="sandbox died")
               for i, (r, c) in enumerate(zip(rewards, causes, strict=True))]
    # uniform: these tests pin the plain permutation (the balanced one: test_reward_shuffle.py)
    shuffle = None if shuffle_seed is None else RewardShuffle(shuffle_seed, "uniform")
    return prepare_group(results, group_index=index, reward_funcs=[], scale_rewards=False,
                         dispatch_version=0, shuffle=shuffle)


def test_without_the_flag_each_rollout_keeps_its_own_reward():
    g = _group([1.0, 0.0, 0.0, 0.5], 0, None)
    assert g.rewards == [1.0, 0.0, 0.0, 0.5] and not g.shuffled
    assert all("reward_unshuffled" not in r for r in g.per_rollout)
    assert group_metrics([g], [])["reward/shuffled"] == 0.0


def test_shuffled_rewards_are_a_permutation_that_leaves_unscored_and_tampered_in_place():
    rewards = [1.0, None, 0.0, 0.25, 0.0, 0.75]
    causes = ["ok", "infra_failure", "tampered", "ok", "ok", "ok"]
    g = _group(rewards, 7, 0, causes)
    assert g.shuffled and group_metrics([g], [])["reward/shuffled"] == 1.0
    assert g.rewards[1] is None and g.rewards[2] == 0.0  # unscorable; tampered's 0 stays its own
    moved = [0, 3, 4, 5]
    assert sorted(g.rewards[i] for i in moved) == sorted(rewards[i] for i in moved)
    for i in moved:  # every record says what it earned and what it was paid
        assert g.per_rollout[i]["reward_unshuffled"] == rewards[i]
        assert g.per_rollout[i]["reward"] == g.rewards[i]
    # Deterministic per (seed, group index), different across groups.
    assert _group(rewards, 7, 0, causes).rewards == g.rewards
    orders = {tuple(_group([0.0, 1.0, 2.0, 3.0, 4.0], i, 0).rewards) for i in range(20)}
    assert len(orders) > 5


def test_under_shuffling_the_reward_no_longer_follows_the_rollout():
    # The rollout that earned 1 gets it back only about 1 time in 4 (uniform over 4 places),
    # and its advantage is as often negative as that of any other rollout.
    kept = Counter()
    for i in range(400):
        g = _group([1.0, 0.0, 0.0, 0.0], i, 3)
        kept[g.rewards.index(1.0)] += 1
    assert all(60 <= kept[p] <= 140 for p in range(4)), kept
    assert _group([1.0, 0.0, 0.0, 0.0], 0, None).per_rollout[0]["advantage"] > 0


def test_the_flags_reach_the_trainer_and_stay_off_the_eval_command():
    s = settings_from_args(build_parser("t", "d"), ["--shuffle-rewards", "--eval-tasks",
                                                   "family:heldout", "--eval-rollouts-per-task",
                                                   "3"])
    assert s.shuffle_rewards and s.trainer_config().shuffle_rewards
    assert (s.eval_tasks, s.eval_rollouts_per_task) == ("family:heldout", 3)
    assert RunSettings().trainer_config().shuffle_rewards is False
    eval_flags = {a.dest for a in build_parser("e", "d", eval_mode=True)._actions}
    assert not {"shuffle_rewards", "eval_tasks", "eval_rollouts_per_task"} & eval_flags


def test_before_after_settings_are_checked_with_their_fix():
    assert before_after_problems(RunSettings()) == []
    assert before_after_problems(RunSettings(eval_tasks="family:heldout")) == []
    wrong = RunSettings(eval_tasks="family:nope", weight_sync=False, eval_rollouts_per_task=0)
    # The settings here; the split where rollouts run (harness.service.preflight.rollout_problems).
    problems = before_after_problems(wrong) + eval_task_problems(wrong)
    text = "\n".join(problems)
    assert len(problems) == 3
    assert "untrained model" in text and ">= 1" in text and "family:nope" in text


def _summary(per_task: dict[str, tuple[int, int]], unscored: int = 0) -> dict:
    rows = {t: {"passed": p, "scored": s, "unscored": 0} for t, (p, s) in per_task.items()}
    passed, scored = sum(p for p, _ in per_task.values()), sum(s for _, s in per_task.values())
    return {"per_task": rows, "passed": passed, "scored": scored, "unscored": unscored,
            "overall_pass_rate": passed / scored}


def test_the_before_after_table_reports_rates_and_the_change_in_points():
    before = _summary({"a": (1, 4), "b": (0, 4)})
    after = _summary({"a": (4, 4), "b": (1, 4)}, unscored=2)
    table, data = before_after_table(before, after)
    assert data["before_pass_rate"] == 0.125 and data["after_pass_rate"] == 0.625
    assert data["change_points"] == pytest.approx(50.0)
    assert data["per_task"]["a"]["change_points"] == pytest.approx(75.0)
    assert [c._cells for c in table.columns][0] == ["a", "b", "overall"]
    assert table.columns[3]._cells[-1] == "+50.0 points"
    assert "2 unscored" in table.caption


def _png_size(path: Path) -> tuple[int, int]:
    """A PNG's (width, height), after checking its signature and every chunk's CRC."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, kinds = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        kinds.append(kind)
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        pos += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and b"IDAT" in kinds
    return width, height


def _texts(fig) -> dict[str, Any]:
    (ax,) = fig.axes
    return {"title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "legend": [t.get_text() for t in ax.get_legend().get_texts()],
            "xticks": [t.get_text() for t in ax.get_xticklabels()],
            "yticks": [t.get_text() for t in ax.get_yticklabels()]}


def test_every_run_writes_its_reward_curve_as_json_and_a_labelled_png(tmp_path: Path):
    from harness.run.learning import reward_series
    from harness.run.plots import line_figure

    history = [{"step": 1.0, "reward/mean": 0.1, "reward/scored": 4.0},
               {"step": 2.0, "reward/mean": 0.4, "reward/scored": 4.0,
                "rollout/correctness_mean": 0.25},
               {"step": 3.0, "reward/mean": 0.3, "reward/scored": 4.0,
                "rollout/correctness_mean": 0.5}]
    json_path, png_path = write_reward_curve(tmp_path, history, shuffled=True)
    curve = json.loads(json_path.read_text())
    assert curve == {"steps": [1, 2, 3], "reward_mean": [0.1, 0.4, 0.3],
                     "rollouts_scored": [4.0, 4.0, 4.0], "shuffled_rewards": True,
                     "env_reward_mean": [None, 0.25, 0.5]}
    assert _png_size(png_path) == (640, 360)
    # The figure the PNG is drawn from, rebuilt from the JSON beside it: its lines are the data.
    series = reward_series(curve)
    fig = line_figure(curve["steps"], series, title="t", xlabel="training step", ylabel="r")
    (ax,) = fig.axes
    lines = {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
             for line in ax.get_lines()}
    assert lines["reward mean (shuffled)"] == ([1, 2, 3], [0.1, 0.4, 0.3])
    xs, ys = lines["verifier reward mean (pass = 1)"]
    assert xs == [1, 2, 3] and math.isnan(ys[0]) and ys[1:] == [0.25, 0.5]  # None: a gap
    texts = _texts(fig)
    assert texts["legend"] == list(series) and texts["xlabel"] == "training step"
    assert [float(t.replace("\u2212", "-")) for t in texts["xticks"] if t] == \
        [float(x) for x in ax.get_xticks() if float(x).is_integer()]  # integer steps only


def test_a_series_of_the_wrong_length_is_refused_by_name():
    from harness.run.plots import line_figure

    with pytest.raises(ValueError, match="series 'a' has 1 values for 2 x values"):
        line_figure([1, 2], {"a": [0.5]}, title="t", xlabel="x", ylabel="y")


def test_the_before_after_chart_shows_each_task_overall_and_the_change(tmp_path: Path):
    from harness.run.learning import write_before_after_chart
    from harness.run.plots import before_after_figure

    long = "family-heldout/read-the-value-then-write-it-into-the-named-file-0007"
    before = {"per_task": {long: {"passed": 1, "scored": 4, "unscored": 0},
                           "short": {"passed": 0, "scored": 0, "unscored": 4}},
              "passed": 1, "scored": 4, "unscored": 4}
    after = {"per_task": {long: {"passed": 3, "scored": 4, "unscored": 0},
                          "short": {"passed": 2, "scored": 4, "unscored": 0}},
             "passed": 5, "scored": 8, "unscored": 0}
    _, data = before_after_table(before, after)
    assert write_before_after_chart(tmp_path) is None  # no before_after.json: no chart
    (tmp_path / "before_after.json").write_text(json.dumps(data))
    png = write_before_after_chart(tmp_path)
    assert png == tmp_path / "before_after.png"
    fig = before_after_figure(data)
    width, height = (round(v * fig.dpi) for v in fig.get_size_inches())
    assert _png_size(png) == (width, height) and width == 800
    (ax,) = fig.axes
    texts = _texts(fig)
    assert texts["legend"] == ["before training", "after training"]
    assert "pass rate" in texts["xlabel"] and texts["title"]
    # Task names wrap onto lines, never cut: the label is the whole name once joined.
    assert [t.replace("\n", "") for t in texts["yticks"]] == [long, "short", "overall"]
    assert all(len(line) <= 32 for t in texts["yticks"] for line in t.split("\n"))
    bars = [p.get_width() for p in ax.patches]
    assert bars[0] == 25.0 and math.isnan(bars[1]) and bars[2] == 25.0  # short before: no bar
    assert bars[3:] == [75.0, 50.0, 62.5]
    notes = [t.get_text() for t in ax.texts if t.get_gid() == "change"]
    assert notes == ["+50.0 points", "not scored", "+37.5 points"]
    values = [t.get_text() for t in ax.texts if t.get_gid() != "change"]  # at each bar's end
    assert values == ["25%", "", "25%", "75%", "50%", "62%"]


# --- the held-out evaluation, end to end with a real agent ----------------------------------

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
_TASK = re.compile(r"(?:Create|file|named) (\S+\.txt)\b.*?(?:containing|content is) (\S+?)\.\s",
                   re.DOTALL)
_WRITE = re.compile(r"Write the word (\S+) into the file (\S+?)\.\s")


def _target(request: dict[str, Any]) -> tuple[str, str]:
    text = json.dumps(request.get("messages") or []).replace("\\n", "\n")
    if m := _WRITE.search(text):
        return m.group(2), m.group(1)
    m = _TASK.search(text)
    assert m, "no family instruction in the request"
    return m.group(1), m.group(2)


def policy(request: dict[str, Any]) -> str:
    """Solves every task whose file is answer.txt; writes the wrong word everywhere else."""
    from harness.audit.scripted_engine import shell_tool_name, tool_call

    name = shell_tool_name(request)
    if any(m.get("role") == "tool" for m in request["messages"]):
        return tool_call(name, command=SUBMIT)
    file, word = _target(request)
    if file != "answer.txt":
        word = "wrong"
    return tool_call(name, command=f"echo {word} > /app/{file}")


@pytest.mark.agents
@pytest.mark.slow
def test_the_held_out_evaluation_counts_real_verifier_passes(tiny_model_path: Path,
                                                             tmp_path: Path):
    from capture import CaptureServer
    from harness.audit.scripted_engine import ScriptedEngine
    from launchers.paths import agent_bin

    try:
        agent_bin("mini")
    except Exception as exc:  # noqa: BLE001 - its message names ./setup.sh
        pytest.fail(f"mini-swe-agent is not installed here: {exc}")
    tasks = [t for t in family_tasks("heldout") if t.metadata["template"] in (1, 2)][:4]
    assert {t.metadata["file"] for t in tasks} & {"answer.txt"}
    settings = RunSettings(eval_tasks=str(FAMILY_DIR / "heldout"), eval_rollouts_per_task=1,
                           max_agent_steps=4, agent_timeout_s=150, max_concurrent_rollouts=4)
    from harness.service.factory import HarborSessionFactory

    with ScriptedEngine(tiny_model_path, policy) as engine, CaptureServer(engine.url) as proxy:
        def make_factory(split, sampling):
            return HarborSessionFactory(
                proxy.admin_url, admin_key=proxy.admin_key, split=split,
                harness=settings.harness, sandbox=settings.sandbox, llm_url=engine.url,
                model=settings.served_model_name, sampling=sampling,
                max_concurrent_rollouts=settings.max_concurrent_rollouts,
                agent_timeout_s=settings.agent_timeout_s, max_steps=settings.max_agent_steps)

        summary = evaluate_split(make_factory, settings, tasks, tmp_path, "before")
    expected = {t.full_name: int(t.metadata["file"] == "answer.txt") for t in tasks}
    got = {name: row["passed"] for name, row in summary["per_task"].items()}
    assert got == expected, summary
    assert summary["scored"] == len(tasks) and summary["unscored"] == 0, summary
    assert json.loads((tmp_path / "eval-before" / "eval_summary.json").read_text()) == summary
    assert len((tmp_path / "eval-before" / "rollouts.jsonl").read_text().splitlines()) == 4
    assert not engine.errors


# --- bench/learning: the seeds-and-controls table ----------------------------------------------

def test_preflight_reports_a_bad_eval_split_before_any_process_starts():
    from harness.run.preflight import preflight

    problems = preflight(RunSettings(eval_tasks="family:nope", tasks="family:train"), train=True)
    assert any(p.startswith("--eval-tasks 'family:nope'") for p in problems), problems
    assert not any("family:train" in p for p in problems), problems
