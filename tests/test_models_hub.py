"""`--model org/name`: resolved once through huggingface_hub's real client, served locally after.

Run: .venv/bin/python -m pytest tests/test_models_hub.py -q

The hub cannot be reached from here, so it is a small local HTTP server speaking the routes
`snapshot_download` uses (revision info, tree listing, HEAD/GET of resolve URLs), pointed at
with HF_ENDPOINT. Each case runs `python -m launchers.models` in a fresh process, because
huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_OFFLINE once, at import.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

import pytest

from launchers.engine import Engine
from launchers.paths import REPO_ROOT

SHA_V1 = "1" * 40
SHA_V2 = "2" * 40
FILES = {"config.json": b'{"model_type": "qwen3", "hidden_size": 64}',
         "tokenizer.json": b'{"version": "1.0"}',
         "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ",
         "pytorch_model.bin": b"a duplicate of the weights nobody should download"}


class FakeHub:
    """One model repo, `org/tiny`: refs -> commits, each commit -> files. Records requests."""

    def __init__(self) -> None:
        self.commits = {SHA_V1: dict(FILES)}
        self.refs = {"main": SHA_V1, "v1": SHA_V1}
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, status: int, body: bytes, headers: dict | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _json(self, body: object, status: int = 200, headers: dict | None = None) -> None:
                self._reply(status, json.dumps(body).encode(),
                            {"Content-Type": "application/json", **(headers or {})})

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = urlparse(self.path).path
                hub.requests.append(f"{self.command} {path}")
                api = "/api/models/org/tiny/"
                if not (path.startswith(api) or path.startswith("/org/tiny/resolve/")):
                    return self._json({"error": "Repository not found"}, 404,
                                      {"X-Error-Code": "RepoNotFound"})
                if path.startswith(api + "revision/"):
                    sha = hub.refs.get(path.rsplit("/", 1)[1], path.rsplit("/", 1)[1])
                    if sha not in hub.commits:
                        return self._json({"error": "Invalid rev id"}, 404,
                                          {"X-Error-Code": "RevisionNotFound"})
                    return self._json({"id": "org/tiny", "sha": sha, "siblings": [
                        {"rfilename": name} for name in hub.commits[sha]]})
                if path.startswith(api + "tree/"):
                    files = hub.commits[path.split("/")[6]]
                    return self._json([{"type": "file", "path": name, "size": len(data),
                                        "oid": hashlib.sha1(data).hexdigest()}
                                       for name, data in files.items()])
                sha, _, name = path[len("/org/tiny/resolve/"):].partition("/")
                data = hub.commits.get(hub.refs.get(sha, sha), {}).get(name)
                if data is None:
                    return self._json({"error": "Entry not found"}, 404,
                                      {"X-Error-Code": "EntryNotFound"})
                return self._reply(200, data, {"X-Repo-Commit": sha,
                                               "ETag": f'"{hashlib.sha1(data).hexdigest()}"'})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hub():
    server = FakeHub()
    yield server
    server.close()


def resolve(spec: str, hf_home: Path, endpoint: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    return subprocess.run([sys.executable, "-m", "launchers.models", spec, "--json"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                          env={**clean, "HF_HOME": str(hf_home), "HF_ENDPOINT": endpoint,
                               "HF_HUB_DISABLE_PROGRESS_BARS": "1", **env})


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once the socket closes


def test_a_hub_model_downloads_once_to_a_snapshot_of_one_commit(hub, tmp_path) -> None:
    run = resolve("org/tiny", tmp_path / "hf", hub.url)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    path = Path(out["path"])
    assert out["source"] == "hub" and out["repo_id"] == "org/tiny" and out["revision"] == SHA_V1
    assert path == tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / SHA_V1
    assert (path / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert (path / "config.json").exists() and (path / "tokenizer.json").exists()
    assert not (path / "pytorch_model.bin").exists()  # a duplicate of safetensors is skipped
    assert "GET /api/models/org/tiny/revision/main" in hub.requests
    # Every file was fetched at the resolved commit, never at "main".
    assert all(SHA_V1 in r for r in hub.requests if "/resolve/" in r)


def test_a_push_between_runs_moves_main_but_a_resolved_snapshot_stays_put(hub, tmp_path) -> None:
    first = json.loads(resolve("org/tiny", tmp_path / "hf", hub.url).stdout)
    hub.commits[SHA_V2] = {**FILES, "model.safetensors": FILES["model.safetensors"] + b"  "}
    hub.refs["main"] = SHA_V2
    second = json.loads(resolve("org/tiny", tmp_path / "hf", hub.url).stdout)
    pinned = json.loads(resolve("org/tiny@v1", tmp_path / "hf", hub.url).stdout)
    assert (first["revision"], second["revision"], pinned["revision"]) == (SHA_V1, SHA_V2, SHA_V1)
    assert Path(first["path"], "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert first["path"] == pinned["path"] != second["path"]


def test_a_downloaded_model_resolves_offline_from_the_cache(hub, tmp_path) -> None:
    online = json.loads(resolve("org/tiny", tmp_path / "hf", hub.url).stdout)
    hub.close()
    offline = resolve("org/tiny", tmp_path / "hf", f"http://127.0.0.1:{closed_port()}",
                      HF_HUB_OFFLINE="1")
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["path"] == online["path"]


def test_an_unreachable_hub_is_named_with_the_ways_out(tmp_path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    run = resolve("Qwen/Qwen3-4B", tmp_path / "hf", endpoint)
    assert run.returncode == 2
    assert f"cannot reach the hub at {endpoint}" in run.stderr
    for fix in ("HF_ENDPOINT", "HF_HUB_OFFLINE=1", "local model directory"):
        assert fix in run.stderr
    assert "Traceback" not in run.stderr


def test_offline_mode_without_a_cached_model_says_so(tmp_path) -> None:
    run = resolve("Qwen/Qwen3-4B", tmp_path / "hf", f"http://127.0.0.1:{closed_port()}",
                  HF_HUB_OFFLINE="1")
    assert run.returncode == 2
    assert "HF_HUB_OFFLINE=1 and the model is not in the cache" in run.stderr


def test_an_unknown_revision_and_a_missing_repo_are_told_apart(hub, tmp_path) -> None:
    bad_rev = resolve("org/tiny@nope", tmp_path / "hf", hub.url)
    assert bad_rev.returncode == 2 and "no revision 'nope' in org/tiny" in bad_rev.stderr
    missing = resolve("org/missing", tmp_path / "hf", hub.url)
    assert missing.returncode == 2 and "no such model" in missing.stderr


def test_a_repo_without_safetensors_is_refused(hub, tmp_path) -> None:
    hub.commits[SHA_V1].pop("model.safetensors")
    run = resolve("org/tiny", tmp_path / "hf", hub.url)
    assert run.returncode == 2 and "no *.safetensors" in run.stderr


def test_a_missing_local_path_is_not_sent_to_the_hub(tmp_path) -> None:
    run = resolve(str(tmp_path / "nowhere"), tmp_path / "hf", "http://127.0.0.1:9")
    assert run.returncode == 2 and "no such directory" in run.stderr


def test_the_engine_is_offline_only_for_a_local_model(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model = tmp_path / "model"
    model.mkdir()
    assert Engine(model).environment()["HF_HUB_OFFLINE"] == "1"
    assert "HF_HUB_OFFLINE" not in Engine("org/name").environment()


def test_train_stops_before_any_process_when_the_hub_is_unreachable(tmp_path) -> None:
    endpoint = f"http://127.0.0.1:{closed_port()}"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    run = subprocess.run([sys.executable, "-m", "harness.train", "--model", "Qwen/Qwen3-4B",
                          "--output-dir", str(tmp_path / "run")], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**clean, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": endpoint})
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    said = " ".join(run.stderr.split())  # the console wraps long lines
    assert "cannot start" in said and f"cannot reach the hub at {endpoint}" in said
    assert not (tmp_path / "run" / "logs" / "vllm.log").exists()  # no engine was started
