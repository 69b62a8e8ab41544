# .venv/bin/python -m pytest tests/test_mswea_model.py -q
"""mini-swe-agent's litellm-free model client sends what its litellm client sends.

Harness points mini-swe-agent at `harness_mswea_model.ChatCompletionsModel` (its public
`model.model_class` setting) to save litellm's import at every rollout. Here the real `mini` CLI
runs the same scripted two-turn episode twice against a recording OpenAI-compatible server: once
with its default litellm client, once with ours, from the files and environment that
`MiniSweAgent` itself writes. Every request (path, auth header, JSON body) must be equal, and the
episode must end the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.service.agents import get_agent
from launchers.paths import agent_bin

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _reply(turn: int) -> dict:
    command = "echo hello > made.txt" if turn == 0 else SUBMIT
    call = {"id": f"call_{turn}", "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
    return {"id": f"c{turn}", "object": "chat.completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": "", "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}


class _Recorder(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.requests: list[dict] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                recorder.requests.append(
                    {"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
                out = json.dumps(_reply(turn)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


def _run_mini(tmp: Path, url: str, monkeypatch, *, litellm: bool) -> tuple[list[dict], Path]:
    home = tmp / ("litellm" if litellm else "direct")
    home.mkdir()
    agent = get_agent("mini-swe-agent")(
        tmp / "logs", model_name="tiny", base_url=url, api_key="sess-key", max_steps=4,
        timeout_s=60)
    agent.home = str(home)
    if litellm:
        monkeypatch.setattr(agent, "MODEL_CLIENT", "litellm")  # mini-swe-agent's own default
    for relative, text in agent.config_files().items():
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {"PATH": os.environ["PATH"], **agent.full_env()}
    done = subprocess.run(agent.command("create made.txt"), env=env, cwd=home, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done, home


@pytest.fixture()
def recorder():
    if not agent_bin("mini").exists():
        pytest.fail("mini-swe-agent is not installed: run ./setup.sh")
    server = _Recorder()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_our_model_client_sends_litellms_requests_turn_by_turn(tmp_path, recorder, monkeypatch):
    url = f"http://127.0.0.1:{recorder.server_port}/v1"
    _run_mini(tmp_path, url, monkeypatch, litellm=True)
    with_litellm, recorder.requests[:] = list(recorder.requests), []
    _, home = _run_mini(tmp_path, url, monkeypatch, litellm=False)
    with_ours = recorder.requests

    assert len(with_litellm) == 2, "the scripted episode is two model calls"
    assert with_ours == with_litellm
    assert with_ours[0]["path"] == "/v1/chat/completions"
    assert with_ours[0]["auth"] == "Bearer sess-key"
    assert with_ours[0]["body"]["model"] == "tiny"
    assert not {"api_base", "api_key", "drop_params"} & set(with_ours[0]["body"])
    # The first call's tool call came back in the second request's history, and ran.
    assert with_ours[1]["body"]["messages"][2]["tool_calls"][0]["id"] == "call_0"
    assert (home / "made.txt").read_text() == "hello\n"
    trajectory = json.loads((home / "mini-trajectory.json").read_text())
    assert trajectory["info"]["exit_status"] == "Submitted"
    assert trajectory["info"]["config"]["model_type"].endswith("ChatCompletionsModel")


def test_a_refused_request_is_not_retried(tmp_path):
    """A 4xx (a closed session, a bad key) ends the agent at once instead of 10 slow retries."""

    class Refuser(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refuser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        home = tmp_path / "home"
        home.mkdir()
        agent = get_agent("mini-swe-agent")(
            tmp_path / "logs", model_name="tiny", api_key="k", max_steps=4, timeout_s=60,
            base_url=f"http://127.0.0.1:{server.server_port}/v1")
        agent.home = str(home)
        for relative, text in agent.config_files().items():
            (home / relative).parent.mkdir(parents=True, exist_ok=True)
            (home / relative).write_text(text)
        done = subprocess.run(agent.command("x"), env={"PATH": os.environ["PATH"], **agent.full_env()},
                              cwd=home, timeout=60, capture_output=True, text=True)
        assert "HTTP 401" in done.stdout + done.stderr
    finally:
        server.shutdown()
