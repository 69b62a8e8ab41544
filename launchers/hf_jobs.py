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

What the job then runs (this same file, with --inside: launchers/hf_jobs_inside.py), one venv per
side (venv_pythons):

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
import subprocess
import sys
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    # Run as a script (`uv run --script launchers/hf_jobs.py`, the job's first command): Python
    # put launchers/ on sys.path, not the checkout that holds the launchers package.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launchers.hf_jobs_inside import (  # noqa: E402
    PROXY_PORT,
    REPO,
    LaunchError,
    gpu_count,
    inside_commands,
    run_inside,
    venv_pythons,
)

DEFAULT_FLAVOR = "h200x4"
DEFAULT_IMAGE = "ghcr.io/astral-sh/uv:python3.12-bookworm"
CODE_BUCKET = "harness-jobs"
CODE_MOUNT = "/harness-code"
CODE_ARCHIVE = "harness.tar.gz"
JOB_WORKDIR = "/tmp/harness"
SECRET_NAMES = ("HF_TOKEN", "E2B_API_KEY")
# The job's first command: unpack the code into a writable dir and hand over to this file. The
# train args arrive as "$@" (bash -c SCRIPT NAME ARGS...), so no quoting is rebuilt by hand.
BOOTSTRAP = (
    f"set -euo pipefail; rm -rf {JOB_WORKDIR}; mkdir -p {JOB_WORKDIR}; "
    f"tar -xzf {CODE_MOUNT}/{CODE_ARCHIVE} -C {JOB_WORKDIR}; cd {JOB_WORKDIR}; "
    'exec uv run --script launchers/hf_jobs.py --inside -- "$@"'
)


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
