# /// script
# requires-python = ">=3.12"
# dependencies = ["huggingface_hub>=1.0", "httpx>=0.27"]
# ///
"""Run `harness.train` on rented GPUs with Hugging Face Jobs (or locally with --local).

Submit (from a checkout, with `hf auth login` done and E2B_API_KEY exported):

    uv run launchers/hf_jobs.py --flavor h100x4 --timeout 6h -- --harness opencode \\
        --model Qwen/Qwen3-4B --tasks registry:terminal-bench@2.0 --steps 200
    uv run launchers/hf_jobs.py --dry-run -- --harness codex      # print the job spec and commands

What the job does (this same file, run inside the job with --inside):

    GPU 0           vLLM (launchers.engine, NCCL weight-transfer backend), health-checked
    this host       the capture proxy on 0.0.0.0:PROXY_PORT, exposed with `--expose-public` so
                    E2B sandboxes reach it at https://<job id>--<port>.hf.jobs
    GPUs 1..N-1     the trainer: torchrun --nproc-per-node N-1 -m harness.train --engine-url ...
                    (FSDP2; rank 0 runs the rollouts and pushes weights to vLLM over NCCL)

and stops everything it started, in reverse order, when the trainer exits or the job is stopped.
The checkout is shipped as a job volume (hf jobs syncs a local directory to a bucket), and the
job runs ./setup.sh there, which builds the GPU engine venv where nvidia-smi works.

`--local` runs the same orchestration on this machine (CPU: engine on the CPU, the trainer as a
single process, local bubblewrap sandboxes), which is how the tests check it.

Assumption to know about: the public URL of an exposed port is taken as
https://$JOB_ID--PORT.hf.jobs (the format huggingface_hub documents for JobInfo.endpoints); pass
--proxy-public-url to override it, e.g. when the job runs behind something else.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENGINE_PORT = 8000
PROXY_PORT = 8100
DEFAULT_FLAVOR = "h100x4"


def gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")]) if out.returncode == 0 else 0


def submit_command(args: argparse.Namespace, train_args: list[str]) -> list[str]:
    """The `hf jobs uv run` command line that submits this script with --inside."""
    cmd = ["hf", "jobs", "uv", "run", "--flavor", args.flavor, "--timeout", args.timeout,
           "--secrets", "HF_TOKEN", "--secrets", "E2B_API_KEY",
           "-v", f"{args.repo}:/harness", "--expose-public", str(PROXY_PORT)]
    if args.volume:
        for volume in args.volume:
            cmd += ["-v", volume]
    cmd += ["/harness/launchers/hf_jobs.py", "--inside", "--"] + train_args
    return cmd


def job_spec(args: argparse.Namespace, train_args: list[str]) -> dict:
    return {
        "flavor": args.flavor, "timeout": args.timeout, "secrets": ["HF_TOKEN", "E2B_API_KEY"],
        "volumes": [f"{args.repo}:/harness", *(args.volume or [])],
        "expose_public": [PROXY_PORT], "script": "/harness/launchers/hf_jobs.py",
        "train_args": train_args,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def inside_commands(train_args: list[str], *, gpus: int, local: bool, public_url: str | None,
                    python: str, engine_port: int = ENGINE_PORT) -> dict[str, list[str]]:
    """The processes the job (or --local) starts: setup, engine, trainer."""
    engine = [python, "-m", "launchers.engine", "--host", "127.0.0.1", "--port", str(engine_port)]
    model = _flag_value(train_args, "--model")
    if model:
        engine += ["--model", model]
    engine += ["--weight-transfer-backend", "nccl" if gpus > 0 else "harness_gloo"]
    train = ["-m", "harness.train", "--engine-url", f"http://127.0.0.1:{engine_port}"]
    if not local:
        train += ["--sandbox", "e2b", "--proxy-host", "0.0.0.0", "--proxy-port", str(PROXY_PORT)]
        if public_url:
            train += ["--proxy-public-url", public_url]
    if gpus > 1:
        trainer = ["torchrun", "--standalone", f"--nproc-per-node={gpus - 1}", *train, *train_args]
    else:
        trainer = [python, *train, *train_args]
    return {"setup": ["./setup.sh"], "engine": engine, "trainer": trainer}


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"engine exited with code {process.returncode} before it was healthy")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"engine not healthy after {timeout_s:.0f} s")


def run_inside(train_args: list[str], *, local: bool, public_url: str | None, skip_setup: bool) -> int:
    """Start engine and trainer, wait for the trainer, stop everything in reverse order."""
    os.chdir(REPO)
    gpus = 0 if local else gpu_count()
    if not local and gpus < 2:
        print(f"warning: {gpus} GPU(s) visible; the engine and the trainer share them", file=sys.stderr)
    if public_url is None and not local and os.environ.get("JOB_ID"):
        public_url = f"https://{os.environ['JOB_ID']}--{PROXY_PORT}.hf.jobs"
    python = str(REPO / ".venv" / "bin" / "python")
    # In a job the node is ours; on a shared machine (--local) any fixed port may be taken.
    engine_port = _free_port() if local else ENGINE_PORT
    commands = inside_commands(train_args, gpus=gpus, local=local, public_url=public_url,
                               python=python, engine_port=engine_port)
    if not skip_setup:
        subprocess.run(commands["setup"], check=True)
    env = dict(os.environ)
    engine_env = {**env, "CUDA_VISIBLE_DEVICES": "0"} if gpus > 0 else env
    trainer_env = {**env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(1, gpus)))} if gpus > 1 else env
    engine = subprocess.Popen(commands["engine"], env=engine_env, start_new_session=True)
    started = [engine]
    try:
        _wait_healthy(f"http://127.0.0.1:{engine_port}", engine, timeout_s=1800)
        trainer = subprocess.Popen(commands["trainer"], env=trainer_env, start_new_session=True)
        started.append(trainer)
        return trainer.wait()
    finally:
        for process in reversed(started):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    train_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, train_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(prog="launchers/hf_jobs.py", description=__doc__.split("\n\n")[0],
                                     epilog="Everything after -- goes to python -m harness.train.")
    parser.add_argument("--flavor", default=DEFAULT_FLAVOR, help="HF Jobs hardware flavor")
    parser.add_argument("--timeout", default="6h", help="job timeout (e.g. 90m, 6h)")
    parser.add_argument("--volume", action="append", help="extra job volume SRC:/mount (repeatable)")
    parser.add_argument("--repo", default=str(REPO), help="checkout shipped to the job")
    parser.add_argument("--dry-run", action="store_true", help="print the job spec and commands only")
    parser.add_argument("--local", action="store_true", help="run the job's orchestration here, on CPU")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--proxy-public-url", help="public URL of the proxy (default: from $JOB_ID)")
    parser.add_argument("--skip-setup", action="store_true", help="do not run ./setup.sh first")
    args = parser.parse_args(argv)

    if args.inside or args.local:
        if args.dry_run:
            cmds = inside_commands(train_args, gpus=0 if args.local else gpu_count(), local=args.local,
                                   public_url=args.proxy_public_url,
                                   python=str(REPO / ".venv" / "bin" / "python"))
            print(json.dumps({name: shlex.join(c) for name, c in cmds.items()}, indent=1))
            return 0
        return run_inside(train_args, local=args.local, public_url=args.proxy_public_url,
                          skip_setup=args.skip_setup)
    cmd = submit_command(args, train_args)
    if args.dry_run:
        print(json.dumps({"job": job_spec(args, train_args), "submit": shlex.join(cmd),
                          "inside": {name: shlex.join(c) for name, c in inside_commands(
                              train_args, gpus=4, local=False,
                              public_url=f"https://$JOB_ID--{PROXY_PORT}.hf.jobs",
                              python="/harness/.venv/bin/python").items()}}, indent=1))
        return 0
    missing = [v for v in ("E2B_API_KEY",) if not os.environ.get(v)]
    if missing:
        print(f"export {', '.join(missing)} first: the job's sandboxes run on E2B", file=sys.stderr)
        return 2
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    sys.exit(main())
