# .venv/bin/python -m pytest tests/test_engine_api_key.py -q
"""The engine's API key and its dev mode (issue 29, finding 10): with $HARNESS_ENGINE_API_KEY the
real vLLM engine wants the key on /v1 and the capture proxy and weight sync send it; the key
never appears on the command line; and since vLLM 0.32 does not guard its dev-mode routes with
the key, the launcher refuses any host but loopback, saying why.
"""

from __future__ import annotations

import httpx
import pytest

from capture import CaptureClient, CaptureServer
from launchers.engine import API_KEY_ENV, Engine, EngineError
from trainer.weight_sync.client import EngineControlClient

KEY = "engine-test-key-0123456789"


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "engine.example"])
def test_the_engine_refuses_a_host_beyond_loopback_while_dev_mode_is_on(tmp_path, host):
    with pytest.raises(EngineError, match="does not guard those routes with --api-key"):
        Engine(tmp_path, host=host)


def test_the_key_goes_to_vllm_by_its_variable_never_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    engine = Engine(tmp_path)
    assert engine.environment()["VLLM_API_KEY"] == KEY
    assert "--api-key" not in engine.extra_args
    monkeypatch.delenv(API_KEY_ENV)
    assert "VLLM_API_KEY" not in Engine(tmp_path).environment()  # no key: none invented


def test_the_launcher_command_refuses_a_public_host_and_says_why(capsys, tmp_path):
    from launchers.engine import main

    with pytest.raises(SystemExit) as stop:
        main(["--host", "0.0.0.0", "--model", str(tmp_path)])
    assert stop.value.code == 2
    assert "VLLM_SERVER_DEV_MODE" in capsys.readouterr().err


@pytest.mark.slow
def test_a_keyed_engine_refuses_calls_without_the_key_and_the_proxy_sends_it(
        tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, KEY)
    with Engine(tiny_model_path, log_path=tmp_path / "vllm.log") as engine:
        bare = httpx.post(f"{engine.url}/v1/chat/completions", timeout=60, json={
            "model": engine.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 2})
        assert bare.status_code == 401
        with CaptureServer(engine.url) as proxy, \
                CaptureClient(proxy.url, proxy.admin_key) as client:
            info = client.create_session(sampling={"max_tokens": 2})
            reply = httpx.post(f"{info.base_urls['chat']}/chat/completions", timeout=120,
                               headers={"authorization": f"Bearer {info.secret}"},
                               json={"model": "any", "messages": [
                                   {"role": "user", "content": "hi"}]})
            assert reply.status_code == 200, reply.text
            assert client.stats(info.session_id)["n_ok"] == 1
        control = EngineControlClient(engine.url)
        assert control._http.headers["authorization"] == f"Bearer {KEY}"
        control._http.close()
