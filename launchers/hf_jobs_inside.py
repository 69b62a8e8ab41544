"""What an HF Job (or `launchers/hf_jobs.py --local`) runs once it is on its node: the engine,
the rollout service and the trainer, each from its own venv, started in order and stopped in
reverse.

Split from launchers/hf_jobs.py, which submits the job (code bucket, flavor, secrets) and whose
docstring draws the whole layout; this half decides the processes' command lines
(inside_commands: one explicit --model and --output-dir for every process) and runs them
(run_inside). Like the submitting half it imports only the standard library, httpx and yaml, so
it runs under `uv run --script` without the project's venv.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINE_PORT = 8000
PROXY_PORT = 8100  # the capture proxy's agent routes, published (expose_public)
SERVICE_PORT = 8200  # the rollout service, on loopback: only the trainer talks to it
PUBLIC_URL_DEADLINE_S = 1800.0  # the proxy starts after the engine and the model load
# harness.shared.run_config.RunSettings' default --harness and launchers.warm_models' default model
# folder (tests/test_same_weights.py checks both against the code that owns them).
DEFAULT_HARNESS = "mini-swe-agent"
WARM_MODEL_NAME = "tiny-qwen3-create-file"
LOOKUP_MODEL_NAME = "tiny-qwen3-lookup"
DEFAULT_TASKS = "lookup:train"  # harness.shared.run_config.RunSettings.tasks
# What the job image lacks for ./setup.sh (bubblewrap: step 1; npm: the agent CLIs).
APT_PACKAGES = ("bubblewrap", "nodejs", "npm", "git")


class LaunchError(SystemExit):
    """A launch cannot go ahead; the message says why and what to do (exit code 2)."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message



def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


def _flag_value(argv: list[str], flag: str) -> str | None:
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value  # the last one wins, as in argparse


def _with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """`argv` with every `flag` occurrence replaced by one `flag value` at the end."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
        elif arg == flag:
            skip = i + 1 < len(argv)
        elif not arg.startswith(flag + "="):
            out.append(arg)
    return [*out, flag, value]


def run_setting(train_args: list[str], flag: str) -> str | None:
    """What `harness.train` will read for `flag`: the flag's value, else its key in the --config
    YAML (flags override the file, as in harness.shared.run_config), else None. The engine must see the
    trainer's --model and --served-model-name whichever of the two gives them."""
    value = _flag_value(train_args, flag)
    if value is not None:
        return value
    config = _flag_value(train_args, "--config")
    if not config or not Path(config).is_file():
        return None  # a missing file: harness.train names it before anything loads
    import yaml  # a dependency of huggingface_hub, so present under `uv run` too

    try:
        loaded = yaml.safe_load(Path(config).read_text()) or {}
    except yaml.YAMLError:
        return None  # harness.train reports the YAML error
    if not isinstance(loaded, dict):
        return None
    name = flag[2:]
    value = loaded.get(name, loaded.get(name.replace("-", "_")))
    return None if value is None else str(value)


def default_model(harness: str | None, root: str | Path = REPO, tasks: str | None = None) -> str:
    """The directory `harness.train` loads when no --model is given (launchers.models.resolve_model
    with None): on the lookup family (the default --tasks) mini-swe-agent gets the lookup warm
    start and an agent its own lookup one where it is committed (opencode, Claude Code); else the
    agent's own committed create-file warm start where there is one, else mini-swe-agent's.
    Read from the committed folders here, without importing launchers.models (it needs the project
    venv; a submit runs under `uv run` with huggingface_hub alone). tests/test_same_weights.py
    checks it against resolve_model for every --harness."""
    harness = harness or DEFAULT_HARNESS
    if (tasks or DEFAULT_TASKS).startswith("lookup:"):
        if harness == DEFAULT_HARNESS:
            return str(Path(root) / "models" / LOOKUP_MODEL_NAME)
        own_lookup = f"{LOOKUP_MODEL_NAME}-{harness}"  # launchers.warm_models.LOOKUP_AGENTS'
        if (REPO / "models" / own_lookup / "BUILD.json").is_file():
            return str(Path(root) / "models" / own_lookup)
    own = f"{WARM_MODEL_NAME}-{harness}"
    name = own if (REPO / "models" / own / "BUILD.json").is_file() else WARM_MODEL_NAME
    return str(Path(root) / "models" / name)


def fresh_output_dir(kind: str = "train") -> str:
    """A new run folder, named as harness.shared.run_dir names one, chosen once by the launcher so the
    service (its capture log) and every trainer rank write the same folder."""
    return f"runs/{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{kind}"


def with_run_model(train_args: list[str], root: str | Path = REPO) -> list[str]:
    """`train_args` with an explicit --model (the flag, the --config file's, or the harness's
    default) and --output-dir, so the engine, the service and every trainer rank agree."""
    model = run_setting(train_args, "--model") or default_model(
        run_setting(train_args, "--harness"), root, run_setting(train_args, "--tasks"))
    out = run_setting(train_args, "--output-dir") or fresh_output_dir()
    return _with_flag(_with_flag(train_args, "--model", model), "--output-dir", out)


def venv_pythons(root: str | Path, gpus: int) -> dict[str, str]:
    """Which venv runs which process. The project venv (.venv: harbor, openenv) runs the engine's
    launcher and the rollout service; the trainer runs from .trainer-venv on GPUs (vLLM's NCCL
    weight-transfer engine imports in the trainer, and vLLM cannot share a venv with openenv:
    requirements/trainer-gpu.txt) and from .venv on CPU (the gloo sync needs no vLLM there)."""
    root = Path(root)
    project = str(root / ".venv" / "bin" / "python")
    trainer = str(root / ".trainer-venv" / "bin" / "python") if gpus > 0 else project
    return {"project": project, "trainer": trainer}


# harness.train's engine sizes -> vLLM's flags. In a job the launcher starts the engine, so the
# sizes go to it; the trainer is given the engine's URL and sizes 1 (it refuses sizes with
# --engine-url: they size an engine it would launch).
ENGINE_SIZE_FLAGS = {"--engine-tensor-parallel-size": "--tensor-parallel-size",
                     "--engine-data-parallel-size": "--data-parallel-size"}


def engine_sizes(train_args: list[str]) -> dict[str, int]:
    """The run's engine sizes by harness.train flag (its flags or its --config file; 1 when
    unset). A size that is not a whole number >= 1 is a LaunchError naming the flag."""
    sizes = {}
    for flag in ENGINE_SIZE_FLAGS:
        value = run_setting(train_args, flag) or "1"
        try:
            sizes[flag] = int(value)
        except ValueError:
            sizes[flag] = 0
        if sizes[flag] < 1:
            raise LaunchError(f"{flag} {value}: must be a whole number >= 1")
    return sizes


def gpu_split(train_args: list[str], gpus: int) -> tuple[list[int], list[int]]:
    """(the engine's GPUs, the trainer's): the engine takes the first tensor x data parallel
    GPUs, the trainer the rest. One GPU: they share it (the job warns); none: the CPU path."""
    engine = 1
    for size in engine_sizes(train_args).values():
        engine *= size
    if gpus == 0:  # the CPU path (--local): no devices to split; the engine takes its sizes
        return [], []
    if gpus == 1:
        if engine > 1:
            raise LaunchError(f"the engine wants {engine} GPUs (tensor x data parallel) and "
                              f"{gpus} are visible: pick a flavor with more GPUs")
        return [0], [0]
    if engine >= gpus:
        raise LaunchError(f"the engine wants {engine} of the {gpus} GPUs (tensor x data "
                          "parallel), leaving none for the trainer: lower "
                          "--engine-tensor-parallel-size/--engine-data-parallel-size or pick a "
                          "flavor with more GPUs")
    return list(range(engine)), list(range(engine, gpus))


def inside_commands(train_args: list[str], *, gpus: int, local: bool, public_url: str | None,
                    python: str, trainer_python: str | None = None,
                    engine_port: int = ENGINE_PORT,
                    service_port: int = SERVICE_PORT,
                    root: str | Path = REPO) -> dict[str, list[str]]:
    """The processes the job (or --local) starts, in order: engine, rollout service, trainer.

    `python` is the project venv's (engine launcher, rollout service), `trainer_python` the
    trainer's (default: `python`). The engine and every trainer rank get the same explicit
    --model: `train_args`' own (run_inside has already resolved a hub id to its local snapshot),
    the --config file's, or, with neither, the directory harness.train would pick for the
    --harness (default_model, under `root`: the checkout the job runs from). Without this the
    engine served mini-swe-agent's warm start while an opencode trainer loaded opencode's. The
    service and the trainer share a key through $HARNESS_SERVICE_KEY (run_inside sets it).
    """
    train_args = with_run_model(train_args, root)
    trainer_gpus = len(gpu_split(train_args, gpus)[1])  # before the sizes go to the engine
    engine_url = f"http://127.0.0.1:{engine_port}"
    engine = [python, "-m", "launchers.engine", "--host", "127.0.0.1", "--port", str(engine_port)]
    for flag in ("--model", "--served-model-name"):  # what the engine serves = what agents ask
        value = run_setting(train_args, flag)
        if value:
            engine += [flag, value]
    engine += ["--weight-transfer-backend", "nccl" if gpus > 0 else "harness_gloo"]
    for flag, size in engine_sizes(train_args).items():
        if size > 1:
            engine += [ENGINE_SIZE_FLAGS[flag], str(size)]
            train_args = _with_flag(train_args, flag, "1")
    lora_rank = run_setting(train_args, "--lora-rank")
    if lora_rank and lora_rank != "0":  # adapters pushed at run time (trainer/weight_sync/lora.py)
        engine += ["--lora-rank", lora_rank]
    # The rollout service: tasks, sandboxes, agents and the capture proxy (its per-call log
    # under the run's output dir, as when harness.train starts it).
    service = [python, "-m", "harness.serve", "--engine-url", engine_url, "--host", "127.0.0.1",
               "--port", str(service_port), "--max-sessions",
               run_setting(train_args, "--max-concurrent-rollouts") or "6",
               "--data-dir", run_setting(train_args, "--output-dir")]
    if not local:
        # 0.0.0.0: the agent routes only; the proxy keeps its admin routes on loopback.
        service += ["--sandbox", "e2b", "--proxy-host", "0.0.0.0", "--proxy-port", str(PROXY_PORT)]
        if public_url:
            service += ["--proxy-public-url", public_url]
    train = ["-m", "harness.train", "--engine-url", engine_url,
             "--rollout-service", f"http://127.0.0.1:{service_port}"]
    if not local:
        train += ["--sandbox", "e2b"]  # the service's sandboxes, named in each rollout request
    trainer_python = trainer_python or python
    commands = {"engine": engine, "service": service}
    if trainer_gpus > 1:
        # The trainer's own interpreter runs torchrun's module: a bare `torchrun` may not be on
        # PATH, and it must be the trainer venv's.
        commands["trainer"] = [trainer_python, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={trainer_gpus}", *train, *train_args]
    else:
        commands["trainer"] = [trainer_python, *train, *train_args]
    return commands


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _setup(skip: bool, local: bool) -> None:
    if skip:
        return
    import shutil

    missing = [p for p, exe in zip(APT_PACKAGES, ("bwrap", "node", "npm", "git"), strict=True)
               if shutil.which(exe) is None]
    if missing and not local and shutil.which("apt-get"):
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    subprocess.run(["./setup.sh"], check=True)


def _resolve_model(python: str, train_args: list[str]) -> list[str]:
    """Download a hub --model once (project venv, launchers.models); pass its snapshot dir on."""
    model = run_setting(train_args, "--model")
    if not model:
        return train_args  # inside_commands gives every process the harness's default
    out = subprocess.run([python, "-m", "launchers.models", model], capture_output=True, text=True)
    if out.returncode != 0:
        raise LaunchError(out.stderr.strip() or f"resolving --model {model} failed")
    return _with_flag(train_args, "--model", out.stdout.strip().splitlines()[-1])


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float,
                  what: str = "engine") -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchError(f"{what} exited with code {process.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise LaunchError(f"{what} at {url} not healthy after {timeout_s:.0f} s")


def watch_public_url(public_url: str, trainer: subprocess.Popen, deadline_s: float,
                     poll_s: float = 10.0) -> threading.Thread:
    """Until the trainer's proxy answers /health through `public_url`, poll; past `deadline_s`
    (engine start and model load included) stop the trainer: its sandboxes could not reach it."""
    import httpx

    def watch() -> None:
        deadline, last = time.monotonic() + deadline_s, "no answer"
        while trainer.poll() is None and time.monotonic() < deadline:
            try:
                reply = httpx.get(public_url.rstrip("/") + "/health", timeout=10)
                if reply.status_code == 200 and "weight_version" in reply.json():
                    print(f"public URL {public_url} reaches the capture proxy", file=sys.stderr)
                    return
                last = f"HTTP {reply.status_code}: {reply.text[:200]}"
            except (httpx.HTTPError, ValueError) as exc:
                last = repr(exc)
            time.sleep(poll_s)
        if trainer.poll() is None:
            print(f"error: the public URL {public_url} did not reach the capture proxy within "
                  f"{deadline_s:.0f} s (last: {last}); sandboxes cannot reach it. Pass the job's "
                  f"exposed URL for port {PROXY_PORT} with --proxy-public-url (see `hf jobs "
                  "inspect <id>`). Stopping the trainer.", file=sys.stderr)
            os.killpg(trainer.pid, signal.SIGTERM)

    thread = threading.Thread(target=watch, name="public-url-watch", daemon=True)
    thread.start()
    return thread


def run_inside(train_args: list[str], *, local: bool, public_url: str | None, skip_setup: bool) -> int:
    """Set up, resolve the model, start engine and trainer; stop both in reverse order."""
    os.chdir(REPO)
    _setup(skip_setup, local)
    gpus = 0 if local else gpu_count()
    if not local and gpus < 2:
        print(f"warning: {gpus} GPU(s) visible; the engine and the trainer share them", file=sys.stderr)
    if public_url is None and not local:
        if not os.environ.get("JOB_ID"):
            raise LaunchError("no --proxy-public-url and no $JOB_ID to derive the public URL from; "
                              f"pass the job's URL for port {PROXY_PORT}")
        public_url = f"https://{os.environ['JOB_ID']}--{PROXY_PORT}.hf.jobs"
    pythons = venv_pythons(REPO, gpus)
    if not Path(pythons["trainer"]).exists():
        raise LaunchError(f"no trainer venv at {pythons['trainer']}: ./setup.sh builds it where "
                          "nvidia-smi works (requirements/trainer-gpu.txt)")
    python = pythons["project"]
    train_args = _resolve_model(python, train_args)
    # In a job the node is ours; on a shared machine (--local) any fixed port may be taken.
    engine_port = _free_port() if local else ENGINE_PORT
    service_port = _free_port() if local else SERVICE_PORT
    commands = inside_commands(train_args, gpus=gpus, local=local, public_url=public_url,
                               python=python, trainer_python=pythons["trainer"],
                               engine_port=engine_port, service_port=service_port)
    # No blanket HF_HUB_OFFLINE: --tasks hf:org/repo still needs the hub. The engine sets it
    # itself for a local model directory (launchers/engine.py). The service and the trainer
    # share a fresh key; the repo is importable from every venv.
    env = {**os.environ, "HARNESS_SERVICE_KEY": secrets.token_urlsafe(32),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    engine_gpus, trainer_gpus = gpu_split(train_args, gpus)
    engine_env = ({**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, engine_gpus))} if gpus > 0
                  else env)
    # The service needs no GPU; it must not grab one the engine or the trainer uses.
    service_env = {**env, "CUDA_VISIBLE_DEVICES": ""} if gpus > 0 else env
    trainer_env = ({**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, trainer_gpus))} if gpus > 1
                   else env)
    started: list[subprocess.Popen] = []
    try:
        engine = subprocess.Popen(commands["engine"], env=engine_env, start_new_session=True)
        started.append(engine)
        service = subprocess.Popen(commands["service"], env=service_env, start_new_session=True)
        started.append(service)
        _wait_healthy(f"http://127.0.0.1:{engine_port}", engine, timeout_s=1800)
        _wait_healthy(f"http://127.0.0.1:{service_port}", service, timeout_s=300,
                      what="rollout service")
        trainer = subprocess.Popen(commands["trainer"], env=trainer_env, start_new_session=True)
        started.append(trainer)
        if not local:
            watch_public_url(public_url, trainer, PUBLIC_URL_DEADLINE_S)
        return trainer.wait()
    finally:
        for process in reversed(started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)

