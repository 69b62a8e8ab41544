"""`python -m harness.train` / `harness.eval` settings, preflight and records (HF Jobs: test_hf_jobs.py).

Run: .venv/bin/python -m pytest tests/test_train_cli.py -q
These need no engine: every check here runs before any process would start.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.eval import pass_rate_table
from harness.run.preflight import preflight
from harness.shared.errors import CAUSES
from harness.shared.run_config import (
    RunSettings,
    SettingsError,
    build_parser,
    load_callable,
    parse_reward_funcs,
    settings_from_args,
)
from harness.shared.run_records import summary_tables
from launchers.paths import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples" / "reward_fns.py"


def parse(argv: list[str]) -> RunSettings:
    return settings_from_args(build_parser("harness.train", "test"), argv)


def test_flags_override_the_config_file_and_untyped_flags_do_not(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("harness: codex\nsteps: 7\nnum-generations: 6\n")
    settings = parse(["--config", str(config), "--steps", "2"])
    assert settings.harness == "codex"  # from the file
    assert settings.num_generations == 6  # from the file, dashes accepted
    assert settings.steps == 2  # the typed flag wins
    assert settings.max_concurrent_rollouts == RunSettings().max_concurrent_rollouts  # default


def test_a_typed_flag_wins_over_the_file_even_when_it_equals_the_default(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("steps: 5\nweight_sync: false\nharness: codex\n")
    assert RunSettings().steps == 12 and RunSettings().weight_sync is True
    settings = parse(["--config", str(config), "--steps", "12", "--weight-sync",
                      "--harness", "mini-swe-agent"])
    # Each typed value equals its default; before, they lost to the file (steps 5, no sync, codex).
    assert (settings.steps, settings.weight_sync, settings.harness) == (12, True, "mini-swe-agent")
    untyped = parse(["--config", str(config)])
    assert (untyped.steps, untyped.weight_sync, untyped.harness) == (5, False, "codex")


def test_repeated_flags_replace_the_files_list(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("reward_funcs: [c=examples.reward_fns:env_or_none]\n")
    typed = parse(["--config", str(config), "--reward-funcs", "a=m:f", "--reward-funcs", "b=m:g"])
    assert typed.reward_funcs == ["a=m:f", "b=m:g"]
    assert parse(["--config", str(config)]).reward_funcs == ["c=examples.reward_fns:env_or_none"]
    assert parse([]).reward_funcs == []


def test_config_values_are_typed_like_their_flags(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    # YAML 1.1 reads 1e-6 (no dot) as a string; the flag would parse it, so the file does too.
    config.write_text("learning_rate: 1e-6\ntemperature: 1\ntask_count: null\n"
                      "reward_funcs: [a=examples.reward_fns:env_or_none]\nengine_port: '8000'\n")
    settings = parse(["--config", str(config)])
    assert settings.learning_rate == 1e-6 and isinstance(settings.learning_rate, float)
    assert settings.temperature == 1.0 and isinstance(settings.temperature, float)
    assert settings.task_count is None and settings.engine_port == 8000
    assert settings.reward_funcs == ["a=examples.reward_fns:env_or_none"]


def test_config_values_of_the_wrong_type_are_all_named_with_their_flag(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("steps: 2.5\nnum_generations: true\nweight_sync: 'yes please'\n"
                      "learning_rate: fast\nharness: null\nreward_funcs: [1, 2]\n")
    with pytest.raises(SettingsError) as caught:
        parse(["--config", str(config)])
    text = str(caught.value)
    assert "steps: expected int (like --steps), got 2.5" in text
    assert "num_generations: expected int (like --num-generations), got the boolean True" in text
    assert "weight_sync: expected true or false (like --weight-sync/--no-weight-sync)" in text
    assert "learning_rate: expected float (like --learning-rate), got 'fast'" in text
    assert "harness: expected str (like --harness), got null" in text
    assert "reward_funcs: expected a list of strings" in text
    assert len(caught.value.problems) == 6


def test_an_unknown_setting_in_the_config_file_is_named(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("stepz: 3\n")
    with pytest.raises(SettingsError, match="unknown settings stepz"):
        parse(["--config", str(config)])


def test_every_shipped_config_file_loads_and_passes_the_trainer_validation() -> None:
    configs = sorted((REPO_ROOT / "configs").glob("*.yaml"))
    assert configs, "configs/ should ship at least one example run config"
    for config in configs:
        settings = parse(["--config", str(config)])
        assert settings.trainer_config().validate() == [], config


def test_preflight_reports_every_problem_at_once_before_anything_starts(monkeypatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    settings = RunSettings(harness="codex", sandbox="e2b", tasks="/nonexistent",
                           reward_fn="nope.module:fn", engine_url="http://127.0.0.1:9", steps=0,
                           ready_timeout_s=1.0)  # nothing listens on port 9: no 600 s wait
    problems = preflight(settings, train=True)
    text = "\n".join(problems)
    assert "--tasks '/nonexistent'" in text
    assert "E2B_API_KEY" in text
    assert "--proxy-public-url" in text  # a remote sandbox must reach the proxy
    assert "--engine-url http://127.0.0.1:9" in text
    assert "--reward-fn nope.module:fn" in text
    assert "--steps=0" in text  # the trainer's max_steps, named by its flag
    assert len(problems) >= 6


def test_preflight_accepts_the_embedded_cpu_default() -> None:
    assert preflight(RunSettings(), train=True) == []


def test_train_exits_2_with_the_fix_when_settings_are_bad() -> None:
    run = subprocess.run([sys.executable, "-m", "harness.train", "--tasks", "/nonexistent"],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert "cannot start" in run.stderr and "'bundled'" in run.stderr


def test_help_documents_every_setting() -> None:
    run = subprocess.run([sys.executable, "-m", "harness.train", "--help"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=60)
    for flag in ("--harness", "--model", "--tasks", "--sandbox", "--engine-url", "--num-generations",
                 "--max-concurrent-rollouts", "--steps", "--output-dir", "--reward-fn",
                 "--config", "--resume"):
        assert flag in run.stdout, flag


def test_reward_functions_load_from_a_module_path_and_a_file_path() -> None:
    by_module = load_callable("examples.reward_fns:shaped_reward")
    by_file = load_callable(f"{EXAMPLES}:shaped_reward")
    outcome = SimpleNamespace(env_reward=1.0, tool_call_count=2, tool_failure_count=0, timed_out=False)
    # 1.0 verifier + 0.1 for calling tools + 0.1 because none failed
    assert by_module(outcome) == by_file(outcome) == pytest.approx(1.2)
    failing = SimpleNamespace(env_reward=0.0, tool_call_count=2, tool_failure_count=1, timed_out=True)
    assert by_module(failing) == pytest.approx(0.1 - 0.5)  # called tools, one failed, timed out


def test_shaped_reward_keeps_unscored_rollouts_unscored() -> None:
    shaped = load_callable("examples.reward_fns:shaped_reward")
    unscored = SimpleNamespace(env_reward=None, tool_call_count=3, tool_failure_count=0, timed_out=True)
    assert shaped(unscored) is None


def test_named_reward_functions_parse_with_weights() -> None:
    parsed = parse_reward_funcs(["pass=examples.reward_fns:env_or_none",
                                 "tools=examples.reward_fns:tool_discipline*0.25",
                                 "examples.reward_fns:shaped_reward"])
    assert [(name, weight) for name, _, weight in parsed] == [("pass", 1.0), ("tools", 0.25),
                                                              ("shaped_reward", 1.0)]


def test_pass_rate_counts_unscored_rollouts_apart_from_fails() -> None:
    records = [{"task_id": "a", "env_reward": 1.0}, {"task_id": "a", "env_reward": 0.0},
               {"task_id": "b", "env_reward": None}, {"task_id": "b", "env_reward": 1.0}]
    _, summary = pass_rate_table(records)
    # 2 passes out of 3 scored rollouts; the unscored one is not a fail.
    assert summary["passed"] == 2 and summary["scored"] == 3 and summary["unscored"] == 1
    assert summary["overall_pass_rate"] == pytest.approx(2 / 3)
    assert summary["per_task"]["a"] == {"passed": 1, "scored": 2, "unscored": 0}


def test_summary_tables_show_causes_steps_and_phases() -> None:
    records = [{"cause": "ok", "timings": {"total": 2.0}}, {"cause": "infra_failure", "timings": {}}]
    history = [{"reward/mean": 0.5, "loss": 0.1, "tokens/trained": 40, "groups/skipped/zero_variance": 1}]
    tables = summary_tables(records, history, {"engine_start_s": 30.0})
    assert [t.title for t in tables] == ["Rollouts by cause", "Training steps",
                                         "Time per phase (s)"]

    def rows(table) -> list[tuple[str, ...]]:  # a table's cells, row by row, as printed
        return list(zip(*(map(str, column.cells) for column in table.columns), strict=True))

    causes, steps, phases = tables
    counted = dict(rows(causes))
    assert (counted["ok"], counted["infra_failure"], counted["total"]) == ("1", "1", "2")
    assert set(counted) == {*CAUSES, "total"}  # every cause listed, the absent ones at 0
    assert all(counted[c] == "0" for c in CAUSES if c not in ("ok", "infra_failure"))
    assert [c.header for c in steps.columns] == ["step", "reward mean", "loss", "tokens trained",
                                                 "groups skipped", "sync s"]
    (step,) = rows(steps)
    assert step[0] == "1" and float(step[1]) == 0.5 and float(step[2]) == 0.1
    assert step[3:5] == ("40", "1")
    # the run's phases, then each rollout phase's mean over the rollouts that had it
    assert rows(phases) == [("engine_start_s", "30.0"), ("rollout total (mean)", "2.0")]


def test_the_defaults_resolve_the_learning_rate_and_the_held_out_split_from_the_run() -> None:
    """The tiny models train at 5e-4; a model of one's own must not get that silently."""
    tiny = parse([])
    assert (tiny.model, tiny.learning_rate) == (None, 5e-4)
    assert (tiny.tasks, tiny.eval_tasks, tiny.max_agent_steps, tiny.eval_rollouts_per_task) == (
        "lookup:train", "lookup:test", 2, 1)  # 96 test tasks, one rollout each
    create = parse(["--tasks", "family:train"])
    assert (create.eval_tasks, create.max_agent_steps, create.eval_rollouts_per_task) == (
        "family:heldout", 1, 8)
    own = parse(["--model", "Qwen/Qwen3-4B", "--tasks", "bundled"])
    assert own.learning_rate == 1e-6 and own.eval_tasks is None and own.max_agent_steps == 8
    assert parse(["--model", "Qwen/Qwen3-4B", "--learning-rate", "3e-5"]).learning_rate == 3e-5
    assert parse(["--model", str(REPO_ROOT / "models" / "tiny-qwen3")]).learning_rate == 5e-4
    assert parse(["--eval-tasks", "none"]).eval_tasks is None
    assert parse(["--tasks", "bundled", "--eval-tasks", "family:heldout"]).eval_tasks == (
        "family:heldout")


@pytest.mark.parametrize(("harness", "model"), [
    ("mini-swe-agent", "tiny-qwen3-lookup"), ("opencode", "tiny-qwen3-lookup-opencode"),
    ("codex", "tiny-qwen3-create-file-codex"),
    ("claude-code", "tiny-qwen3-lookup-claude-code"),
])
def test_each_agent_runs_the_warm_start_made_for_its_prompts(tmp_path: Path, harness: str,
                                                              model: str) -> None:
    """No --model: the engine and the trainer load the committed warm start of --harness for the
    default lookup:* tasks (its own lookup build where there is one, else its create-file one; one
    taught on another agent's prompts answers Codex's with no tool call: 0 of 96)."""
    from harness.run.stack import RunStack

    stack = RunStack(parse(["--harness", harness]), tmp_path, weight_transfer=False)
    assert stack.resolve_model().path == REPO_ROOT / "models" / model == stack.model_path
    base = str(REPO_ROOT / "models" / "tiny-qwen3")
    own = RunStack(parse(["--harness", "codex", "--model", base]), tmp_path, weight_transfer=False)
    assert own.resolve_model().path == REPO_ROOT / "models" / "tiny-qwen3"  # --model wins


def test_the_trainer_trains_the_tasks_every_rollout_service_loads_and_is_told_their_order() -> None:
    from harness.train import _train_task_names

    class Pool:
        def __init__(self, answers):
            self.answers = answers

        def tasks(self, split, task_count=None):
            return self.answers

    settings = parse([])
    assert settings.shuffle_tasks and settings.trainer_config().shuffle_dataset
    assert not parse(["--no-shuffle-tasks"]).trainer_config().shuffle_dataset
    names = ["fam/a", "fam/b"]
    assert _train_task_names(settings, Pool({"http://s1": names, "http://s2": names})) == names
    with pytest.raises(SettingsError, match="http://s2: give every rollout service the same"):
        _train_task_names(settings, Pool({"http://s1": names, "http://s2": names[:1]}))
    with pytest.raises(SettingsError, match="http://s1: no tasks found"):
        _train_task_names(settings, Pool({"http://s1": "no tasks found"}))


def test_max_staleness_reaches_the_trainer_and_a_negative_one_is_named() -> None:
    """--max-staleness 0 is the synchronous, reproducible run (tests/test_train_reproducible.py
    runs it twice); the default keeps sampling one step ahead of the trainer."""
    assert parse([]).trainer_config().max_staleness == 1
    sync = parse(["--max-staleness", "0"]).trainer_config()
    assert sync.max_staleness == 0 and not sync.validate()
    problems = parse(["--max-staleness", "-1"]).trainer_config().validate()
    assert any("max_staleness=-1" in p and ">= 0" in p for p in problems), problems
    assert "--max-staleness" not in build_parser("e", "d", eval_mode=True).format_help()
