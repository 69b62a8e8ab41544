# /// script
# requires-python = ">=3.12"
# dependencies = ["huggingface_hub>=2.4", "httpx>=0.27"]
# ///
"""Run `harness.train` on rented GPUs with Hugging Face Jobs (or locally with --local).

Submit (from a checkout, logged in with `hf auth login`, E2B_API_KEY exported):

    uv run launchers/hf_jobs.py --flavor h200x4 --timeout 6h -- --harness opencode \\
        --model Qwen/Qwen3-4B --tasks registry:terminal-bench@2.0 --steps 200
    uv run launchers/hf_jobs.py --dry-run -- --harness codex    # print the job and the commands

How a job is built (huggingface_hub's `HfApi.run_job`, the same call `hf jobs run` makes):

    code     the checkout's files (git ls-files: tracked + untracked, not ignored) as one
             tar.gz, uploaded to the bucket <you>/harness-jobs (`create_bucket`,
             `batch_bucket_files`) and mounted read-only at /harness-code; the job unpacks
             it into /tmp/harness, a writable copy where setup.sh, venvs and runs/ live
    image    ghcr.io/astral-sh/uv:python3.12-bookworm (huggingface_hub's uv image: Python 3.12,
             uv, apt); the job installs bubblewrap/nodejs/npm with apt, then runs ./setup.sh,
             which builds the GPU engine venv and the trainer venv where nvidia-smi works
    flavor   one of huggingface_hub's JobHardware values (checked before anything is sent)
    secrets  HF_TOKEN (your saved login or $HF_TOKEN: gated models, the code bucket) and
             E2B_API_KEY (the sandboxes)
    ports    only the capture proxy's agent port is published, without authentication
             (expose_public), so E2B sandboxes reach it with their session secret alone. The
             proxy binds it on 0.0.0.0 and then serves its admin routes on a separate
             127.0.0.1 listener only (capture/server.py): they never leave the node; the
             rollout service listens on loopback only

What the job then runs (this same file, with --inside), one venv per side (venv_pythons):

    model        a hub --model is downloaded once (launchers.models) and both processes get
                 the local snapshot: the same commit for the engine and the trainer; with no
                 --model (flag or --config), both get the --harness's committed warm start
                 (default_model), the directory harness.train itself would load
    run folder   one --output-dir for the service's capture log and every trainer rank
                 (default: a new runs/<UTC time>-train, chosen here once)
    GPU 0        vLLM (launchers.engine, NCCL weight-transfer backend), health-checked
    no GPU       the rollout service, from the project venv (.venv: harbor, openenv):
                 .venv/bin/python -m harness.serve --engine-url ... --sandbox e2b, its capture
                 proxy on 0.0.0.0:8100, published as https://<job id>--8100.hf.jobs; the
                 launcher watches that public URL answer the proxy's /health and stops the job
                 with the fix if it never does
    GPUs 1..N-1  the trainer, from the trainer venv (.trainer-venv: torch, transformers, vLLM's
                 NCCL weight transfer; no openenv, no harbor): -m torch.distributed.run
                 --nproc-per-node N-1 -m harness.train --engine-url ... --rollout-service
                 http://127.0.0.1:8200 (FSDP2; rank 0 sends the rollouts to the service and
                 pushes weights to vLLM over NCCL); the service and the trainer share a fresh
                 $HARNESS_SERVICE_KEY

and stops everything it started, in reverse order, when the trainer exits or the job is stopped.
`--local` runs the same orchestration on this machine (CPU: engine on the CPU, the service and
one trainer process from .venv, local bubblewrap sandboxes, the proxy on loopback), which is how
the tests check it.

Assumption to know about: the public URL is taken as https://$JOB_ID--8100.hf.jobs, the format
huggingface_hub documents for JobInfo.expose_urls, with JOB_ID read from the job's environment.
Neither the variable nor the format could be checked from here, which is why the launcher
watches the URL reach the proxy and stops the job, naming --proxy-public-url, if it never does.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINE_PORT = 8000
PROXY_PORT = 8100  # the capture proxy's agent routes, published (expose_public)
SERVICE_PORT = 8200  # the rollout service, on loopback: only the trainer talks to it
PUBLIC_URL_DEADLINE_S = 1800.0  # the proxy starts after the engine and the model load
DEFAULT_FLAVOR = "h200x4"
DEFAULT_IMAGE = "ghcr.io/astral-sh/uv:python3.12-bookworm"
CODE_BUCKET = "harness-jobs"
CODE_MOUNT = "/harness-code"
CODE_ARCHIVE = "harness.tar.gz"
JOB_WORKDIR = "/tmp/harness"
SECRET_NAMES = ("HF_TOKEN", "E2B_API_KEY")
# harness.shared.run_config.RunSettings' default --harness and launchers.warm_models' default model
# folder (tests/test_same_weights.py checks both against the code that owns them).
DEFAULT_HARNESS = "mini-swe-agent"
WARM_MODEL_NAME = "tiny-qwen3-create-file"
LOOKUP_MODEL_NAME = "tiny-qwen3-lookup"
DEFAULT_TASKS = "lookup:train"  # harness.shared.run_config.RunSettings.tasks
# The job's first command: unpack the code into a writable dir and hand over to this file. The
# train args arrive as "$@" (bash -c SCRIPT NAME ARGS...), so no quoting is rebuilt by hand.
BOOTSTRAP = (
    f"set -euo pipefail; rm -rf {JOB_WORKDIR}; mkdir -p {JOB_WORKDIR}; "
    f"tar -xzf {CODE_MOUNT}/{CODE_ARCHIVE} -C {JOB_WORKDIR}; cd {JOB_WORKDIR}; "
    'exec uv run --script launchers/hf_jobs.py --inside -- "$@"'
)
# What the job image lacks for ./setup.sh (bubblewrap: step 1; npm: the agent CLIs).
APT_PACKAGES = ("bubblewrap", "nodejs", "npm", "git")


class LaunchError(SystemExit):
    """A launch cannot go ahead; the message says why and what to do (exit code 2)."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def job_flavors() -> list[str]:
    """huggingface_hub's own list of Job flavors (JobHardware)."""
    from huggingface_hub import JobHardware

    return [flavor.value for flavor in JobHardware]


def check_flavor(flavor: str) -> str:
    valid = job_flavors()
    if flavor in valid:
        return flavor
    gpus = [f for f in valid if not f.startswith("cpu")]
    raise LaunchError(f"--flavor {flavor!r} is not an HF Jobs flavor of this huggingface_hub. "
                      f"GPU flavors: {', '.join(gpus)}; all: {', '.join(valid)}")


# -- submitting (this machine) ----------------------------------------------------------------------

def code_files(repo: Path) -> list[str]:
    """The checkout's files: tracked plus untracked-but-not-ignored (venvs, caches, runs/ stay)."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, check=False)
    if out.returncode != 0:
        raise LaunchError(f"{repo} is not a git checkout (git ls-files failed: "
                          f"{out.stderr.decode().strip()}); run from a clone of the repo")
    return sorted(f for f in out.stdout.decode().split("\0") if f and (repo / f).is_file())


def code_archive(repo: Path, dest: Path) -> Path:
    """`dest`: a tar.gz of code_files(repo), with paths relative to the repo root."""
    with tarfile.open(dest, "w:gz") as tar:
        for name in code_files(repo):
            tar.add(repo / name, arcname=name)
    return dest


def ship_code(api, namespace: str, repo: Path):  # -> huggingface_hub.Volume
    """Upload the code archive to <namespace>/harness-jobs and return its read-only Volume."""
    from huggingface_hub import Volume

    bucket = f"{namespace}/{CODE_BUCKET}"
    folder = f"code/{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"
    with tempfile.TemporaryDirectory(prefix="harness-code-") as tmp:
        archive = code_archive(repo, Path(tmp) / CODE_ARCHIVE)
        api.create_bucket(bucket, exist_ok=True, private=True)
        api.batch_bucket_files(bucket, add=[(archive, f"{folder}/{CODE_ARCHIVE}")])
    return Volume(type="bucket", source=bucket, mount_path=CODE_MOUNT, path=folder, read_only=True)


def code_volume_from(spec: str):  # -> huggingface_hub.Volume
    """`--code-from NAMESPACE/BUCKET/FOLDER`: reuse an archive a previous submit uploaded."""
    from huggingface_hub import Volume

    parts = spec.strip("/").split("/", 2)
    if len(parts) != 3:
        raise LaunchError(f"--code-from {spec!r}: expected NAMESPACE/BUCKET/FOLDER (printed by an "
                          "earlier submit)")
    return Volume(type="bucket", source=f"{parts[0]}/{parts[1]}", mount_path=CODE_MOUNT,
                  path=parts[2], read_only=True)


def job_request(args: argparse.Namespace, train_args: list[str], code_volume) -> dict:
    """The keyword arguments of `HfApi.run_job`, minus the secrets' values."""
    return {
        "image": args.image,
        "command": ["bash", "-c", BOOTSTRAP, "harness-job", *train_args],
        "env": {"PYTHONUNBUFFERED": "1"},
        "flavor": args.flavor,
        "timeout": args.timeout,
        "volumes": [code_volume],
        "expose_public": [PROXY_PORT],
        "labels": {"app": "harness"},
    }


def job_secrets() -> dict[str, str]:
    from huggingface_hub import get_token

    values = {"HF_TOKEN": get_token(), "E2B_API_KEY": os.environ.get("E2B_API_KEY")}
    missing = [name for name, value in values.items() if not value]
    if missing:
        raise LaunchError(f"missing {', '.join(missing)}: export E2B_API_KEY (the job's sandboxes "
                          "run on E2B) and log in with `hf auth login` or export HF_TOKEN")
    return values


def submit(args: argparse.Namespace, train_args: list[str]) -> int:
    from huggingface_hub import HfApi

    api = HfApi()
    job_secret_values = job_secrets()
    namespace = args.namespace or api.whoami()["name"]
    volume = code_volume_from(args.code_from) if args.code_from else ship_code(api, namespace,
                                                                            Path(args.repo))
    print(f"code: {volume.source}/{volume.path} (reuse with --code-from "
          f"{volume.source}/{volume.path})", file=sys.stderr)
    job = api.run_job(**job_request(args, train_args, volume), secrets=job_secret_values,
                      namespace=namespace)
    print(json.dumps({"id": job.id, "url": job.url, "flavor": str(job.flavor),
                      "public_url": f"https://{job.id}--{PROXY_PORT}.hf.jobs"}))
    return 0


# -- inside the job (or --local) --------------------------------------------------------------------

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
    with None): mini-swe-agent on the lookup family (the default --tasks) gets the lookup warm
    start, else the agent's own committed warm start where there is one, else mini-swe-agent's.
    Read from the committed folders here, without importing launchers.models (it needs the project
    venv; a submit runs under `uv run` with huggingface_hub alone). tests/test_same_weights.py
    checks it against resolve_model for every --harness."""
    harness = harness or DEFAULT_HARNESS
    if harness == DEFAULT_HARNESS and (tasks or DEFAULT_TASKS).startswith("lookup:"):
        return str(Path(root) / "models" / LOOKUP_MODEL_NAME)
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
    engine_url = f"http://127.0.0.1:{engine_port}"
    engine = [python, "-m", "launchers.engine", "--host", "127.0.0.1", "--port", str(engine_port)]
    for flag in ("--model", "--served-model-name"):  # what the engine serves = what agents ask
        value = run_setting(train_args, flag)
        if value:
            engine += [flag, value]
    engine += ["--weight-transfer-backend", "nccl" if gpus > 0 else "harness_gloo"]
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
    if gpus > 1:
        # The trainer's own interpreter runs torchrun's module: a bare `torchrun` may not be on
        # PATH, and it must be the trainer venv's.
        commands["trainer"] = [trainer_python, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={gpus - 1}", *train, *train_args]
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
    engine_env = {**env, "CUDA_VISIBLE_DEVICES": "0"} if gpus > 0 else env
    # The service needs no GPU; it must not grab one the engine or the trainer uses.
    service_env = {**env, "CUDA_VISIBLE_DEVICES": ""} if gpus > 0 else env
    trainer_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(1, gpus)))} if gpus > 1 else env
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


def _terminate(*_: object) -> None:
    raise KeyboardInterrupt  # a job stop (SIGTERM) unwinds run_inside's finally


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="launchers/hf_jobs.py", description=__doc__.split("\n\n")[0],
                                     epilog="Everything after -- goes to python -m harness.train.")
    parser.add_argument("--flavor", default=DEFAULT_FLAVOR,
                        help="HF Jobs hardware flavor (huggingface_hub's JobHardware)")
    parser.add_argument("--timeout", default="6h", help="job timeout (e.g. 90m, 6h)")
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="job image (needs Python 3.12 and uv)")
    parser.add_argument("--namespace", help="user or org that runs the job (default: you)")
    parser.add_argument("--repo", default=str(REPO), help="checkout shipped to the job")
    parser.add_argument("--code-from", help="reuse uploaded code: NAMESPACE/BUCKET/FOLDER")
    parser.add_argument("--dry-run", action="store_true", help="print the job and commands only")
    parser.add_argument("--local", action="store_true", help="run the job's orchestration here, on CPU")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--proxy-public-url", help="public URL of the proxy (default: from $JOB_ID)")
    parser.add_argument("--skip-setup", action="store_true", help="do not run ./setup.sh first")
    args = parser.parse_args(argv)
    try:
        if args.inside or args.local:
            if args.dry_run:
                gpus = 0 if args.local else gpu_count()
                pythons = venv_pythons(REPO, gpus)
                cmds = inside_commands(train_args, gpus=gpus, local=args.local,
                                       public_url=args.proxy_public_url,
                                       python=pythons["project"], trainer_python=pythons["trainer"])
                print(json.dumps({name: shlex.join(c) for name, c in cmds.items()}, indent=1))
                return 0
            signal.signal(signal.SIGTERM, _terminate)
            return run_inside(train_args, local=args.local, public_url=args.proxy_public_url,
                              skip_setup=args.skip_setup)
        check_flavor(args.flavor)
        if args.dry_run:
            from huggingface_hub import Volume

            volume = (code_volume_from(args.code_from) if args.code_from else
                      Volume(type="bucket", source=f"<you>/{CODE_BUCKET}", mount_path=CODE_MOUNT,
                             path="code/<upload>", read_only=True))
            request = job_request(args, train_args, volume)
            request["volumes"] = [v.to_dict() for v in request["volumes"]]
            request["secrets"] = list(SECRET_NAMES)
            pythons = venv_pythons(JOB_WORKDIR, gpus=4)
            inside = inside_commands(train_args, gpus=4, local=False,
                                     public_url=f"https://$JOB_ID--{PROXY_PORT}.hf.jobs",
                                     python=pythons["project"], trainer_python=pythons["trainer"],
                                     root=JOB_WORKDIR)
            print(json.dumps({"job": request, "code_files": len(code_files(Path(args.repo))),
                              "inside": {k: shlex.join(c) for k, c in inside.items()}}, indent=1))
            return 0
        return submit(args, train_args)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
