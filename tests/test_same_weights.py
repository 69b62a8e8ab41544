"""The engine and every trainer rank load the same weights, whichever --harness and launcher path.

Run: .venv/bin/python -m pytest tests/test_same_weights.py -q

The bug this guards: `launchers/hf_jobs.py --dry-run -- --harness opencode` gave the engine no
--model (it served mini-swe-agent's warm start, tiny-qwen3-create-file) while the trainer loaded
opencode's (tiny-qwen3-create-file-opencode): agents sampled from one model, the trainer's
logprobs and updates were another's. Each launcher path is run as a user runs it (the CLI's own
--dry-run output, or the function the job's --inside calls) and the engine's --model is compared
with the trainer's and with what `launchers.models.resolve_model` picks for that harness.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from harness.shared.run_config import HARNESSES, RunSettings
from launchers import hf_jobs, hf_jobs_inside
from launchers.models import resolve_model
from launchers.paths import REPO_ROOT

CASES = [*HARNESSES, None]  # None: no --harness flag, the default


def _flag(argv: list[str], flag: str) -> str | None:
    return hf_jobs_inside._flag_value(argv, flag)


def _train_args(harness: str | None) -> list[str]:
    return [] if harness is None else ["--harness", harness]


def _expected(harness: str | None, root: str | Path) -> str:
    """What harness.train itself loads for this harness with no --model, under `root`."""
    defaults = RunSettings()
    path = resolve_model(None, harness=harness or defaults.harness, tasks=defaults.tasks).path
    return str(Path(root) / path.relative_to(REPO_ROOT))


def _models(commands: dict[str, str]) -> tuple[str | None, str | None]:
    return (_flag(shlex.split(commands["engine"]), "--model"),
            _flag(shlex.split(commands["trainer"]), "--model"))


def test_the_launchers_defaults_are_the_ones_harness_train_uses() -> None:
    from launchers.warm_models import LOOKUP_MODEL, WARM_MODEL

    assert RunSettings().harness == hf_jobs_inside.DEFAULT_HARNESS
    assert WARM_MODEL.name == hf_jobs_inside.WARM_MODEL_NAME
    assert LOOKUP_MODEL.name == hf_jobs_inside.LOOKUP_MODEL_NAME
    assert RunSettings().tasks == hf_jobs_inside.DEFAULT_TASKS


@pytest.mark.parametrize("harness", CASES, ids=lambda h: h or "default")
def test_the_job_dry_run_gives_engine_and_trainer_one_model(harness, capsys) -> None:
    # The submit path: what the job's --inside will run on a 4-GPU node, from /tmp/harness.
    assert hf_jobs.main(["--dry-run", "--", *_train_args(harness)]) == 0
    inside = json.loads(capsys.readouterr().out)["inside"]
    engine, trainer = _models(inside)
    assert engine == trainer == _expected(harness, hf_jobs.JOB_WORKDIR), inside
    assert "torch.distributed.run" in inside["trainer"]  # every rank gets these same args


@pytest.mark.parametrize("harness", CASES, ids=lambda h: h or "default")
def test_the_local_dry_run_gives_engine_and_trainer_one_model(harness, capsys) -> None:
    assert hf_jobs.main(["--local", "--dry-run", "--", *_train_args(harness)]) == 0
    cmds = json.loads(capsys.readouterr().out)
    engine, trainer = _models(cmds)
    assert engine == trainer == _expected(harness, REPO_ROOT), cmds


@pytest.mark.parametrize("harness", CASES, ids=lambda h: h or "default")
@pytest.mark.parametrize("gpus", [0, 2, 4])
def test_the_inside_commands_give_engine_and_trainer_one_model(harness, gpus) -> None:
    # run_inside's own call (after _resolve_model, which leaves no --model untouched).
    cmds = hf_jobs.inside_commands(_train_args(harness), gpus=gpus, local=gpus == 0,
                                   public_url="https://j--8100.hf.jobs", python="/w/py")
    engine = _flag(cmds["engine"], "--model")
    assert engine == _flag(cmds["trainer"], "--model") == _expected(harness, REPO_ROOT)
    # ...and one run folder for the service's capture log and every trainer rank.
    out = _flag(cmds["trainer"], "--output-dir")
    assert out and out == _flag(cmds["service"], "--data-dir")


def test_a_config_files_model_reaches_the_engine_too(tmp_path: Path) -> None:
    # configs/gpu-e2b.yaml names model and harness in the file, not as flags.
    config = REPO_ROOT / "configs" / "gpu-e2b.yaml"
    cmds = hf_jobs.inside_commands(["--config", str(config)], gpus=4, local=False,
                                   public_url="https://j--8100.hf.jobs", python="/w/py")
    assert _flag(cmds["engine"], "--model") == _flag(cmds["trainer"], "--model") == "Qwen/Qwen3-4B"
    # A flag still overrides the file, for both.
    mine = tmp_path / "c.yaml"
    mine.write_text("harness: codex\nserved_model_name: q\n")
    cmds = hf_jobs.inside_commands(["--config", str(mine)], gpus=2, local=False,
                                   public_url=None, python="/w/py")
    assert _flag(cmds["engine"], "--model") == _expected("codex", REPO_ROOT)
    assert _flag(cmds["engine"], "--served-model-name") == "q"
    cmds = hf_jobs.inside_commands(["--config", str(mine), "--model", "/m"], gpus=2, local=False,
                                   public_url=None, python="/w/py")
    assert _flag(cmds["engine"], "--model") == _flag(cmds["trainer"], "--model") == "/m"


@pytest.mark.parametrize("harness", HARNESSES)
def test_harness_train_loads_one_model_on_every_rank(harness, tmp_path) -> None:
    # harness.train's own path: rank 0's RunStack starts the engine on the model it resolves;
    # every other rank resolves it again in _follow (harness/train.py). Both must land on the
    # same directory, the harness's own warm start.
    from harness.run.stack import RunStack

    settings = RunSettings(harness=harness, output_dir=str(tmp_path))
    rank0 = RunStack(settings, tmp_path, weight_transfer=False).resolve_model().path
    follower = resolve_model(settings.model, harness=settings.harness, tasks=settings.tasks).path
    assert rank0 == follower
    assert str(rank0) == _expected(harness, REPO_ROOT)
    own = REPO_ROOT / "models" / f"tiny-qwen3-create-file-{harness}"
    own_lookup = REPO_ROOT / "models" / f"tiny-qwen3-lookup-{harness}"
    expected = ("tiny-qwen3-lookup" if harness in (None, "mini-swe-agent")
                else own_lookup.name if own_lookup.is_dir()
                else own.name if own.is_dir() else "tiny-qwen3-create-file")
    assert rank0.name == expected
