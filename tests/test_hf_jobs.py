"""The HF Jobs launcher against huggingface_hub's real client, and what the job relies on.

Run: .venv/bin/python -m pytest tests/test_hf_jobs.py -q

No hub can be reached from here, so the Jobs HTTP API is a small local server (HF_ENDPOINT) that
records what huggingface_hub's own `HfApi.run_job` sends: the request is the one a real submit
makes. What is not covered: the code upload (`batch_bucket_files` goes through the xet storage
protocol, which has no local fake), and the hf.jobs public URL format (see launchers/hf_jobs.py).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from launchers.paths import REPO_ROOT

JOB_ID = "6650aa0000000000000000aa"


def _lower(headers) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


class FakeJobsApi:
    """`/api/whoami-v2` and `POST /api/jobs/<namespace>`, recording each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict, dict]] = []  # method, path, headers, body
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                api.requests.append(("GET", self.path, _lower(self.headers), {}))
                if self.path.startswith("/api/whoami-v2"):
                    return self._reply(200, {"type": "user", "name": "alice", "id": "u1"})
                return self._reply(404, {"error": f"no route {self.path}"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                api.requests.append(("POST", self.path, _lower(self.headers), body))
                if self.path == "/api/jobs/alice":
                    return self._reply(200, {
                        **body, "id": JOB_ID, "createdAt": "2026-12-01T06:00:00.000Z",
                        "owner": {"id": "u1", "name": "alice", "type": "user"},
                        "status": {"stage": "SCHEDULING", "message": None}})
                return self._reply(404, {"error": f"no route {self.path}"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeJobsApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def launcher(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launchers/hf_jobs.py", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def jobs_api(tmp_path: Path):
    with FakeJobsApi() as api:
        yield api, {"HF_ENDPOINT": api.url, "HF_HOME": str(tmp_path / "hf"),
                    "HF_TOKEN": "hf_fake_token", "E2B_API_KEY": "e2b_fake_key"}


def test_a_submit_sends_huggingface_hubs_real_job_request(jobs_api) -> None:
    api, env = jobs_api
    run = launcher("--flavor", "h200x2", "--timeout", "2h", "--code-from",
                   "alice/harness-jobs/code/20261201-abc", "--", "--harness", "opencode",
                   "--model", "Qwen/Qwen3-4B", env=env)
    assert run.returncode == 0, run.stderr
    posts = [r for r in api.requests if r[0] == "POST"]
    assert len(posts) == 1, api.requests
    _, path, headers, body = posts[0]
    assert path == "/api/jobs/alice"  # the namespace came from whoami
    assert headers["authorization"] == "Bearer hf_fake_token"
    assert body["flavor"] == "h200x2"
    assert body["timeoutSeconds"] == 2 * 3600
    assert body["dockerImage"] == "ghcr.io/astral-sh/uv:python3.12-bookworm"
    # The code: the uploaded archive's bucket folder, read-only, unpacked to a writable dir.
    assert body["volumes"] == [{"type": "bucket", "source": "alice/harness-jobs",
                                "mountPath": "/harness-code", "path": "code/20261201-abc",
                                "readOnly": True}]
    command = body["command"]
    assert command[:2] == ["bash", "-c"]
    assert "tar -xzf /harness-code/harness.tar.gz -C /tmp/harness" in command[2]
    assert 'uv run --script launchers/hf_jobs.py --inside -- "$@"' in command[2]
    assert command[4:] == ["--harness", "opencode", "--model", "Qwen/Qwen3-4B"]
    # Secrets travel as secrets, with their values; nothing secret in the plain environment.
    assert body["secrets"] == {"HF_TOKEN": "hf_fake_token", "E2B_API_KEY": "e2b_fake_key"}
    assert "hf_fake_token" not in json.dumps(body["environment"])
    # Only the proxy's agent port is public; the engine's is not exposed at all.
    assert body["expose"] == {"ports": [8100], "portsPublic": [8100]}
    out = json.loads(run.stdout)
    assert out["id"] == JOB_ID and out["public_url"] == f"https://{JOB_ID}--8100.hf.jobs"


def test_a_flavor_not_in_huggingface_hubs_list_fails_before_anything_is_sent(jobs_api) -> None:
    api, env = jobs_api
    run = launcher("--flavor", "h100x4", "--code-from", "alice/b/c", "--", "--harness", "codex",
                   env=env)
    assert run.returncode == 2
    assert "'h100x4' is not an HF Jobs flavor" in run.stderr
    assert "h200x4" in run.stderr and "a100x8" in run.stderr  # the valid ones are listed
    assert api.requests == []


def test_a_submit_without_the_sandbox_key_names_it_and_sends_nothing(jobs_api) -> None:
    api, env = jobs_api
    env = {**env, "E2B_API_KEY": ""}
    run = launcher("--code-from", "alice/b/c", "--", "--harness", "codex", env=env)
    assert run.returncode == 2 and "E2B_API_KEY" in run.stderr
    assert api.requests == []


def test_the_default_flavor_is_one_huggingface_hub_accepts() -> None:
    from huggingface_hub import JobHardware

    from launchers.hf_jobs import DEFAULT_FLAVOR

    assert DEFAULT_FLAVOR in {flavor.value for flavor in JobHardware}


def test_the_shipped_code_archive_runs_the_launcher_from_an_unpacked_copy(tmp_path: Path) -> None:
    from launchers.hf_jobs import code_archive

    archive = code_archive(REPO_ROOT, tmp_path / "harness.tar.gz")
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path / "copy", filter="data")
    for needed in ("setup.sh", "launchers/hf_jobs.py", "launchers/models.py",
                   "harness/train.py", "trainer/loop.py", "capture/app.py",
                   "requirements/project.txt"):
        assert needed in names, needed
    assert not any(n.startswith((".venv/", ".engine-venv/", ".git/")) for n in names)
    assert os.access(tmp_path / "copy" / "setup.sh", os.X_OK)  # modes survive the trip
    run = subprocess.run([sys.executable, "launchers/hf_jobs.py", "--inside", "--dry-run", "--",
                          "--harness", "opencode"], cwd=tmp_path / "copy", capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    inside = json.loads(run.stdout)
    assert set(inside) == {"engine", "service", "trainer"}


def test_the_job_runs_the_trainer_from_its_venv_and_the_service_with_the_public_proxy() -> None:
    from launchers.hf_jobs import inside_commands, venv_pythons

    pythons = venv_pythons("/w", gpus=4)
    # GPUs: the trainer has its own venv (vLLM's NCCL engine, no openenv); everything else
    # runs from the project venv.
    assert pythons == {"project": "/w/.venv/bin/python", "trainer": "/w/.trainer-venv/bin/python"}
    cmds = inside_commands(["--harness", "opencode", "--model", "/models/snap",
                            "--served-model-name", "qwen", "--output-dir", "/runs/a",
                            "--max-concurrent-rollouts", "16"], gpus=4, local=False,
                           public_url="https://j--8100.hf.jobs", python=pythons["project"],
                           trainer_python=pythons["trainer"])
    assert list(cmds) == ["engine", "service", "trainer"]  # the order they start in
    assert cmds["engine"][0] == "/w/.venv/bin/python"
    assert cmds["engine"][cmds["engine"].index("--served-model-name") + 1] == "qwen"
    assert cmds["engine"][cmds["engine"].index("--model") + 1] == "/models/snap"
    service = " ".join(cmds["service"])
    assert cmds["service"][:3] == ["/w/.venv/bin/python", "-m", "harness.serve"]
    assert "--engine-url http://127.0.0.1:8000" in service
    assert "--host 127.0.0.1 --port 8200" in service  # the service itself stays on loopback
    assert "--proxy-host 0.0.0.0 --proxy-port 8100" in service  # the published port
    assert "--proxy-public-url https://j--8100.hf.jobs" in service
    assert "--sandbox e2b" in service and "--max-sessions 16" in service
    assert "--data-dir /runs/a" in service  # the proxy's log beside the run, as locally
    assert cmds["trainer"][:5] == ["/w/.trainer-venv/bin/python", "-m", "torch.distributed.run",
                                   "--standalone", "--nproc-per-node=3"]
    trainer = " ".join(cmds["trainer"])
    assert "-m harness.train --engine-url http://127.0.0.1:8000" in trainer
    assert "--rollout-service http://127.0.0.1:8200" in trainer
    assert "--sandbox e2b" in trainer
    assert "--proxy-" not in trainer  # the proxy is the service's


def test_the_local_dry_run_uses_the_cpu_path() -> None:
    run = launcher("--local", "--dry-run", "--", "--harness", "mini-swe-agent")
    out = json.loads(run.stdout)
    assert "--weight-transfer-backend harness_gloo" in out["engine"]
    assert "--proxy-host" not in out["trainer"] and "torch.distributed.run" not in out["trainer"]
    assert "--proxy-host" not in out["service"] and "--sandbox" not in out["service"]
    assert "--harness mini-swe-agent" in out["trainer"]
    # CPU: the trainer runs from the project venv too (the gloo sync needs no vLLM in it).
    venv = str(REPO_ROOT / ".venv" / "bin" / "python")
    assert out["trainer"].startswith(venv + " -m harness.train")
    assert out["service"].startswith(venv + " -m harness.serve")
    assert "--rollout-service http://127.0.0.1:8200" in out["trainer"]


def test_a_proxy_on_the_published_address_keeps_its_admin_routes_off_it(tmp_path) -> None:
    # What the job relies on when it publishes the proxy's port (capture/server.py).
    from capture import CaptureClient, CaptureServer

    # The job binds 0.0.0.0, which alone gives the admin routes their own loopback listener;
    # the test binds loopback (services here never listen on every interface) and asks for the
    # same split explicitly.
    assert CaptureServer("http://127.0.0.1:9", host="0.0.0.0").separate_admin
    with CaptureServer("http://127.0.0.1:9", host="127.0.0.1", port=0, admin_on_public=False,
                       data_dir=tmp_path / "capture") as proxy:
        public = f"http://127.0.0.1:{proxy.port}"
        key = {"Authorization": f"Bearer {proxy.admin_key}"}
        for method, path in (("GET", "/admin/sessions"), ("POST", "/admin/sessions"),
                             ("POST", "/admin/weight_version")):
            reply = httpx.request(method, public + path, headers=key, json={"version": 9},
                                  timeout=10)
            assert reply.status_code == 404, (method, path, reply.text)
        assert proxy.admin_url != public and proxy.state.weight_version == 0
        with CaptureClient(proxy.admin_url, proxy.admin_key) as admin:
            session = admin.create_session()
        models = httpx.get(public + f"/s/{session.session_id}/v1/models",
                           headers={"Authorization": f"Bearer {session.secret}"}, timeout=10)
        assert models.status_code != 404  # the agent routes are served on the public address
        assert httpx.get(public + "/health", timeout=10).json()["weight_version"] == 0


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            start_new_session=True)


def test_a_public_url_that_never_reaches_the_proxy_stops_the_trainer(capfd) -> None:
    from launchers.hf_jobs_inside import watch_public_url

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    trainer = _sleeper()
    try:
        watch_public_url(dead, trainer, deadline_s=1.0, poll_s=0.1)
        assert trainer.wait(timeout=60) == -signal.SIGTERM  # awaited: the watcher's stop
    finally:
        trainer.kill()
    assert "--proxy-public-url" in capfd.readouterr().err


def test_a_public_url_that_reaches_the_proxy_leaves_the_trainer_running(tmp_path) -> None:
    from capture import CaptureServer
    from launchers.hf_jobs_inside import watch_public_url

    trainer = _sleeper()
    try:
        with CaptureServer("http://127.0.0.1:9", data_dir=tmp_path / "capture") as proxy:
            watcher = watch_public_url(proxy.url, trainer, deadline_s=120, poll_s=0.1)
            watcher.join(timeout=120)
            assert not watcher.is_alive()
        assert trainer.poll() is None
    finally:
        trainer.kill()
        trainer.wait()


def test_the_jobs_bootstrap_unpacks_the_code_and_passes_every_argument_intact(tmp_path) -> None:
    import shlex

    from launchers import hf_jobs

    mount, work = tmp_path / "mount", tmp_path / "work"
    mount.mkdir()
    hf_jobs.code_archive(REPO_ROOT, mount / hf_jobs.CODE_ARCHIVE)
    # The job's own command, with this machine's paths and interpreter in place of the image's.
    script = (hf_jobs.BOOTSTRAP.replace(hf_jobs.CODE_MOUNT, str(mount))
              .replace(hf_jobs.JOB_WORKDIR, str(work))
              .replace("uv run --script", shlex.quote(sys.executable))
              .replace("--inside --", "--inside --dry-run --"))
    train_args = ["--harness", "opencode", "--tasks", "dir with space/it's", "--reward-funcs",
                  "a=examples.reward_fns:env_or_none*0.5", "--model", "$HOME/`x`"]
    run = subprocess.run(["bash", "-c", script, "harness-job", *train_args], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    trainer = shlex.split(json.loads(run.stdout)["trainer"])
    # No word split, no expansion; the launcher adds the run's --output-dir after the user's
    # arguments (the given --model, already last, stays as given).
    assert trainer[-len(train_args) - 2:-2] == train_args
    assert trainer[-2] == "--output-dir" and trainer[-1].startswith("runs/")
    assert (work / "launchers" / "hf_jobs.py").exists()  # the writable copy it ran from


def test_a_lora_run_starts_its_engine_with_lora_serving_of_the_runs_rank() -> None:
    from launchers.engine import Engine
    from launchers.hf_jobs_inside import inside_commands

    cmds = inside_commands(["--harness", "opencode", "--model", "/models/snap", "--lora-rank",
                            "12"], gpus=2, local=False, public_url="https://j--8100.hf.jobs",
                           python="/w/.venv/bin/python")
    assert cmds["engine"][cmds["engine"].index("--lora-rank") + 1] == "12"
    assert "--lora-rank 12" in " ".join(cmds["trainer"])
    plain = inside_commands(["--harness", "opencode", "--model", "/models/snap"], gpus=2,
                            local=False, public_url="https://j--8100.hf.jobs",
                            python="/w/.venv/bin/python")
    assert "--lora-rank" not in plain["engine"]
    # what launchers.engine makes of it: vLLM's rank 16 (it accepts 1, 8, 16, 32, ...), two
    # adapters per batch (the current version and the one before), the runtime LoRA routes
    engine = Engine("/models/snap", lora_rank=12)
    command = " ".join(engine.command(on_gpu=True))
    assert "--enable-lora --max-lora-rank 16 --max-loras 2" in command
    assert engine.environment()["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert "--enable-lora" not in " ".join(Engine("/models/snap").command(on_gpu=True))


def test_the_engines_parallel_sizes_take_the_first_gpus_and_the_trainer_the_rest(tmp_path) -> None:
    from harness.run.preflight import _engine_parallel_problems
    from harness.shared.run_config import build_parser, settings_from_args
    from launchers.hf_jobs_inside import LaunchError, gpu_split, inside_commands

    args = ["--harness", "opencode", "--model", "/models/snap", "--output-dir", "/runs/a",
            "--engine-tensor-parallel-size", "2", "--engine-data-parallel-size", "2"]
    cmds = inside_commands(args, gpus=8, local=False, public_url="https://j--8100.hf.jobs",
                           python="/w/.venv/bin/python")
    engine = " ".join(cmds["engine"])
    assert "--tensor-parallel-size 2" in engine and "--data-parallel-size 2" in engine
    assert "--nproc-per-node=4" in cmds["trainer"]  # 8 GPUs: 2 x 2 for vLLM, 4 ranks
    assert gpu_split(args, 8) == ([0, 1, 2, 3], [4, 5, 6, 7])
    # The trainer is given the engine's URL and sizes 1: harness.train accepts it as it runs.
    trainer_args = cmds["trainer"][cmds["trainer"].index("harness.train") + 1:]
    settings = settings_from_args(build_parser("t", "t"), trainer_args)
    assert settings.engine_url and settings.engine_tensor_parallel_size == 1
    assert _engine_parallel_problems(settings) == []
    # ...also when the sizes come from the run's --config file
    config = tmp_path / "run.yaml"
    config.write_text("engine_tensor_parallel_size: 4\n")
    from_file = inside_commands(["--config", str(config), "--model", "/m", "--output-dir", "/r"],
                                gpus=8, local=False, public_url=None, python="/p")
    assert "--tensor-parallel-size 4" in " ".join(from_file["engine"])
    assert "--nproc-per-node=4" in from_file["trainer"]
    assert from_file["trainer"][-2:] == ["--engine-tensor-parallel-size", "1"]  # beats the file
    # Plain runs keep one engine GPU; sizes that leave the trainer nothing are refused by name.
    assert gpu_split(["--model", "/m"], 4) == ([0], [1, 2, 3])
    with pytest.raises(LaunchError, match="leaving none for the trainer"):
        gpu_split(args, 4)
    with pytest.raises(LaunchError, match="4 GPUs .* 1 are visible"):
        inside_commands(args, gpus=1, local=False, public_url=None, python="/p")
    with pytest.raises(LaunchError, match="--engine-data-parallel-size two"):
        gpu_split(["--engine-data-parallel-size", "two"], 8)
