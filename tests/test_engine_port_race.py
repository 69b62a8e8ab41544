"""The engine start survives losing its port, and never takes another server for itself.

`Engine` picks a free port, then starts vLLM on it; between the two another process can take the
port (CI saw it: the run's own proxy, asking the OS for any port, was handed the same one). vLLM
then exits on "Address already in use", while the port's /health, now someone else's, answers
200: the run went on against the wrong server and every rollout failed as infra. Now the start
waits for vLLM itself (our served model, owned by vllm, and our process alive) and picks another
port when the one it chose was taken; a port the caller gave is never moved.

Run: .venv/bin/python -m pytest tests/test_engine_port_race.py -q   (one real vLLM start, ~1 min)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import launchers.engine as engine_module
from launchers.engine import Engine, EngineStartError
from launchers.net import free_port
from tests.helpers.http_stub import serving

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def impostor() -> Iterator[int]:
    """Any server on a port: 200 and a models list on every GET, none of it vLLM's."""
    with serving(b'{"data": [{"id": "tiny", "owned_by": "someone-else"}]}') as port:
        yield port


def test_a_picked_port_taken_before_vllm_binds_it_is_replaced(tiny_model_path: Path, impostor: int,
                                                              tmp_path: Path, monkeypatch) -> None:
    picks = iter([impostor])
    # The race, made certain: the pick returns the impostor's port and the check before the
    # launch finds it free (as it was when picked).
    monkeypatch.setattr(engine_module, "free_port", lambda host: next(picks, None) or free_port(host))
    monkeypatch.setattr(engine_module, "_port_in_use", lambda host, port: False)
    engine = Engine(tiny_model_path, log_path=tmp_path / "vllm.log")
    assert engine.port == impostor
    with engine:
        assert engine.port != impostor
        models = httpx.get(f"{engine.base_url}/models", timeout=10).json()["data"]
        assert [(m["id"], m["owned_by"]) for m in models] == [("tiny", "vllm")]
    assert "Address already in use" in (tmp_path / "vllm.log").read_text()


def test_a_port_the_caller_gave_is_not_moved_and_an_impostor_is_not_taken_for_vllm(
        tiny_model_path: Path, impostor: int, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(engine_module, "_port_in_use", lambda host, port: False)
    engine = Engine(tiny_model_path, port=impostor, log_path=tmp_path / "vllm.log",
                    startup_timeout_s=300)
    with pytest.raises(EngineStartError, match="Address already in use"):
        engine.start()
    assert engine.port == impostor and not engine.running
