"""Every command in the README runs as written: each code block is read and each command checked.

Run: .venv/bin/python -m pytest tests/test_readme_commands.py -q

Each shell command is matched by exactly one rule below, which runs it as cheaply as it can be run
for real: its flags parsed by the command's own parser (harness.train/eval/serve: every flag, type
and --config file, the settings every run starts from), its `--help`, its `--dry-run`, or the
command itself where it is cheap (pytest's collection). A command no rule matches fails the test:
a new README command needs a rule. What a rule cannot run here (minutes of vLLM and agents, a GPU,
the hub, a docker daemon) it says in `NOT_RUN`, and the test prints that reason beside the check
it did make. Python blocks are compiled; blocks without a language are layouts, not commands.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.shared.run_config import build_parser, settings_from_args
from launchers.paths import REPO_ROOT

README = REPO_ROOT / "README.md"
PY = ".venv/bin/python"
# Values the README leaves to the reader, as a shell would see them once set.
SHELL_VALUES = {"$MODEL": "/models/snapshot", "$KEY": "k" * 32}


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    return [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)]


def shell_commands(body: str) -> list[str]:
    """One string per command: continuation lines joined, comments and blank lines dropped."""
    commands, current = [], ""
    for line in body.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        current += " " + stripped.removesuffix("\\").strip() if current else stripped.removesuffix(
            "\\").strip()
        if not stripped.endswith("\\"):
            commands.append(current.split("  #")[0].strip())  # a trailing comment
            current = ""
    return commands


def _readme_shell() -> list[str]:
    return [c for lang, body in code_blocks(README.read_text()) if lang == "bash"
            for c in shell_commands(body)]


def _argv(command: str) -> list[str]:
    """The command's argv, with leading VAR=value assignments and a trailing `&` removed."""
    for name, value in SHELL_VALUES.items():
        command = command.replace(name, value)
    argv = shlex.split(command)
    while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
        argv.pop(0)
    return argv[:-1] if argv and argv[-1] == "&" else argv


def _run(argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def _module_args(argv: list[str], module: str) -> list[str]:
    return argv[argv.index(module) + 1:]


def _help_lists_flags(module: str, args: list[str]) -> None:
    run = _run([sys.executable, "-m", module, "--help"], timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    for flag in (a.split("=", 1)[0] for a in args if a.startswith("--")):
        assert flag in run.stdout, f"{module} --help does not list {flag}"


def _settings(module: str, args: list[str]):
    parser = build_parser(f"python -m {module}", "README check", eval_mode=module == "harness.eval")
    return settings_from_args(parser, args)  # SystemExit / SettingsError on a bad flag or value


# --- the rules: (name, predicate on argv, check) -----------------------------------------------

NOT_RUN: dict[str, str] = {}


def check_setup_and(argv: list[str]) -> None:
    """`./setup.sh && <command>`: setup.sh is the one entry point CI runs; the command after it is
    checked by its own rule."""
    cut = argv.index("&&")
    assert argv[:cut] == ["./setup.sh"] and (REPO_ROOT / "setup.sh").stat().st_mode & 0o111
    rest = argv[cut + 1:]
    if rest == [PY, "-m", "pytest"]:
        ci = (REPO_ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
        assert ci == "./setup.sh && .venv/bin/python -m pytest", ci  # the README's is CI's
        NOT_RUN["pytest"] = "the whole suite: this test is part of it (.ci/run runs it)"
        return
    check(rest)


def check_pytest_subset(argv: list[str]) -> None:
    args = _module_args(argv, "pytest")
    run = _run([sys.executable, "-m", "pytest", "--collect-only", "-p", "no:cacheprovider",
                *[a for a in args if a != "-q"]], timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    collected = re.search(r"(\d+)(?:/\d+)? tests? (?:collected|selected)", run.stdout)
    assert collected and int(collected[1]) > 0, run.stdout[-1000:]
    NOT_RUN.setdefault("pytest subset", "collected, not run: running them is the suite's job")


def check_train_or_eval(argv: list[str]) -> None:
    module = "harness.train" if "harness.train" in argv else "harness.eval"
    settings = _settings(module, _module_args(argv, module))
    if settings.reward_fn or settings.reward_funcs:
        from harness.shared.run_config import load_callable, parse_reward_funcs

        if settings.reward_fn:
            assert callable(load_callable(settings.reward_fn))
        assert all(callable(fn) for _, fn, _ in parse_reward_funcs(settings.reward_funcs))
    if settings.sandbox == "docker":
        NOT_RUN["docker"] = "this machine has no docker daemon, and ./my-tasks is the reader's"
    NOT_RUN.setdefault(module, "parsed by its own parser, not run: minutes of vLLM, agents and "
                       "sandboxes (tests/test_train_e2e.py runs the real command on a small budget)")


def check_torchrun_trainer(argv: list[str]) -> None:
    """The GPU trainer: its harness.train flags, and an --output-dir every rank agrees on."""
    assert argv[argv.index("-m") + 1] == "torch.distributed.run"
    settings = _settings("harness.train", _module_args(argv, "harness.train"))
    assert settings.output_dir, "torchrun needs an explicit --output-dir (harness.shared.run_dir)"
    assert settings.ready_timeout_s > 0
    from harness.shared.run_dir import check_run_dir

    assert not any("required under torchrun" in p for p in
                   check_run_dir(settings.output_dir, "train", world_size=3))
    NOT_RUN["torchrun"] = "needs GPUs and .trainer-venv (built only where nvidia-smi works)"


def check_serve(argv: list[str]) -> None:
    from harness.serve import build_parser as serve_parser

    args = serve_parser().parse_args(_module_args(argv, "harness.serve"))
    assert args.engine_url.startswith("http://")
    if args.proxy_public_url:
        assert args.proxy_public_url.startswith("http://"), "the proxy speaks plain HTTP"
    NOT_RUN["harness.serve"] = "parsed, not started: it needs a running engine (and E2B's key)"


def check_view(argv: list[str]) -> None:
    _help_lists_flags("harness.view", _module_args(argv, "harness.view"))
    NOT_RUN["harness.view"] = ("--help only: it serves until stopped, on a run folder made by a "
                               "train or eval above (tests/test_view_browser.py drives it)")


def check_engine(argv: list[str]) -> None:
    _help_lists_flags("launchers.engine", _module_args(argv, "launchers.engine"))
    NOT_RUN["launchers.engine"] = "--help only: NCCL weight transfer needs a GPU"


def check_model_download(argv: list[str]) -> None:
    _help_lists_flags("launchers.models", [])
    NOT_RUN["launchers.models"] = "--help only: downloading Qwen/Qwen3-4B needs the hub"


def check_export(argv: list[str]) -> None:
    """The variables the GPU commands read, by the names the code reads them under."""
    from harness.client.remote import KEY_ENV
    from harness.service.sandboxes.expose import SANDBOX_BACKENDS

    names = {a.split("=", 1)[0] for a in argv[1:]}
    assert names == {"E2B_API_KEY", KEY_ENV}
    assert "E2B_API_KEY" in SANDBOX_BACKENDS["e2b"].credentials
    NOT_RUN["export"] = "sets the shell's variables; checked against the names the code reads"


def check_hf_jobs(argv: list[str]) -> None:
    """`uv run launchers/hf_jobs.py ...`, run with this venv's python and --dry-run (uv may be
    absent; the dry run prints the job request and its commands without sending anything)."""
    import json

    args = argv[argv.index("launchers/hf_jobs.py") + 1:]
    if "--dry-run" not in args:
        args = ["--dry-run", *args]
        NOT_RUN["hf_jobs submit"] = "run with --dry-run: a submit rents GPUs"
    run = _run([sys.executable, "launchers/hf_jobs.py", *args], timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    inside = json.loads(run.stdout)["inside"]
    from launchers.hf_jobs_inside import _flag_value

    engine, trainer = shlex.split(inside["engine"]), shlex.split(inside["trainer"])
    model = _flag_value(engine, "--model")  # the engine and every trainer rank load one model
    assert model and model == _flag_value(trainer, "--model")


RULES: list[tuple[str, Callable[[list[str]], bool], Callable[[list[str]], None]]] = [
    ("setup", lambda a: "&&" in a, check_setup_and),
    ("pytest", lambda a: a[:3] == [PY, "-m", "pytest"], check_pytest_subset),
    ("torchrun", lambda a: a[0] == ".trainer-venv/bin/python", check_torchrun_trainer),
    ("train/eval", lambda a: a[:3] in ([PY, "-m", "harness.train"], [PY, "-m", "harness.eval"]),
     check_train_or_eval),
    ("serve", lambda a: a[:3] == [PY, "-m", "harness.serve"], check_serve),
    ("view", lambda a: a[:3] == [PY, "-m", "harness.view"], check_view),
    ("engine", lambda a: a[:3] == [PY, "-m", "launchers.engine"], check_engine),
    ("model", lambda a: a[0].startswith("MODEL=$("), check_model_download),
    ("export", lambda a: a[0] == "export", check_export),
    ("hf_jobs", lambda a: a[:3] == ["uv", "run", "launchers/hf_jobs.py"], check_hf_jobs),
]


def check(argv: list[str]) -> None:
    matched = [(name, fn) for name, pred, fn in RULES if pred(argv)]
    assert len(matched) == 1, f"{shlex.join(argv)}: matched {[n for n, _ in matched]}; add a rule"
    matched[0][1](argv)


def _case_argv(command: str) -> list[str]:
    if command.startswith("MODEL=$("):  # a command substitution: checked by its rule
        return [command]
    if command.startswith("export "):
        return ["export", *[w.split("=", 1)[0] + "=" for w in command.split()[1:] if "=" in w]]
    return _argv(command)


@pytest.mark.parametrize("command", _readme_shell())
def test_every_readme_shell_command_runs_as_written(command: str, capsys) -> None:
    NOT_RUN.clear()
    check(_case_argv(command))
    with capsys.disabled():
        for what, why in NOT_RUN.items():
            print(f"\n  README `{command[:60]}...`: {what}: {why}")


def test_every_python_block_compiles_and_every_block_is_accounted_for() -> None:
    blocks = code_blocks(README.read_text())
    assert blocks, "README.md has no code blocks"
    for lang, body in blocks:
        assert lang in ("bash", "python", ""), f"a {lang!r} block: add how to check it"
        if lang == "python":
            compile(body, "README.md", "exec")
    # The commands the README promises are all here (a rule silently matching nothing would
    # pass every case above).
    commands = _readme_shell()
    assert "./setup.sh && .venv/bin/python -m harness.train --harness mini-swe-agent" in commands
    assert "./setup.sh && .venv/bin/python -m pytest" in commands
    assert len(commands) >= 15


def test_the_compare_example_evaluates_the_checkpoint_the_train_command_writes() -> None:
    # README "Evaluate, train, compare": the second eval's --model must be the folder the train
    # command's settings export the final model to, and the viewer must compare the two evals' folders.
    commands = [_argv(c) for c in _readme_shell() if "oc" in c and "runs/oc" in c]
    train = next(_settings("harness.train", _module_args(a, "harness.train"))
                 for a in commands if "harness.train" in a)
    evals = [_settings("harness.eval", _module_args(a, "harness.eval"))
             for a in commands if "harness.eval" in a]
    view = next(a for a in commands if "harness.view" in a)
    config = train.trainer_config()
    assert config.export_model  # the final model in HF layout at <trainer output>/model
    written = Path(config.output_dir) / "model"
    assert len(evals) == 2 and evals[1].model == str(written)
    assert evals[0].tasks == evals[1].tasks == "family:heldout"  # not the train tasks
    assert evals[0].rollouts_per_task == evals[1].rollouts_per_task
    assert evals[0].harness == evals[1].harness == train.harness
    assert view[3:] == [evals[0].output_dir, "--compare", evals[1].output_dir]
