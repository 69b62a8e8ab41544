# Run: .venv/bin/python -m pytest tests/test_sandbox_expose.py -x -q
"""`--sandbox` names map to Harbor environments, and the proxy is exposed to remote ones.

No network here: the tunnel is a real subprocess that prints a URL the way cloudflared does, and
Harbor's remote environment classes are resolved (imported) but never started.
"""

from __future__ import annotations

import sys
import time

import pytest
from harbor.environments.factory import _load_environment_class
from harbor.models.environment_type import EnvironmentType
from harbor.utils.import_path import import_class

from harness.service.sandboxes import (
    SANDBOX_BACKENDS,
    ExposeError,
    environment_config,
    expose_proxy,
)
from harness.service.sandboxes.expose import backend_problems
from tests.helpers.waiting import wait_until

PROXY = "http://127.0.0.1:41234"


@pytest.mark.parametrize("name", sorted(SANDBOX_BACKENDS))
def test_every_sandbox_name_resolves_to_an_importable_harbor_environment(name: str):
    config = environment_config(name, kwargs={"forward_urls": [PROXY]} if name == "local" else {})
    if config.import_path is not None:
        cls = import_class(config.import_path, label="environment")
    else:
        assert config.type is not None
        try:
            cls = _load_environment_class(EnvironmentType(config.type))
        except ImportError as exc:
            pytest.skip(f"Harbor's {name} backend needs its extra here: {exc}")
    assert cls.type() in (name, "bwrap")


def test_an_unknown_sandbox_name_lists_the_known_ones():
    with pytest.raises(ExposeError, match="choose one of local, docker"):
        environment_config("vmware")


def test_remote_backends_without_credentials_say_which_variable_is_missing(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    assert any("E2B_API_KEY" in p for p in backend_problems("e2b"))


def test_the_local_sandbox_uses_the_proxy_through_its_loopback_forward():
    exposure = expose_proxy("http://10.1.2.3:41234", sandbox="local")
    assert exposure.agent_url("http://10.1.2.3:41234/s/abc/v1") == "http://127.0.0.1:41234/s/abc/v1"


def test_a_remote_sandbox_without_exposure_names_both_options():
    with pytest.raises(ExposeError, match=r"--proxy-public-url.*--proxy-tunnel"):
        expose_proxy(PROXY, sandbox="e2b")


def test_a_loopback_public_url_is_refused_for_a_remote_sandbox():
    with pytest.raises(ExposeError, match="loopback"):
        expose_proxy(PROXY, sandbox="modal", public_url="http://localhost:41234")


def test_a_public_url_rewrites_session_urls_for_the_agent():
    exposure = expose_proxy(PROXY, sandbox="daytona", public_url="https://proxy.example.org/")
    assert exposure.agent_url(f"{PROXY}/s/ab12/v1") == "https://proxy.example.org/s/ab12/v1"
    with pytest.raises(ExposeError):
        exposure.agent_url("http://127.0.0.1:9999/s/ab12/v1")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_tunnel_command_gives_the_public_url_and_dies_on_close():
    # Prints its banner like cloudflared, with the proxy port substituted in, then stays up.
    script = (
        "import sys, time; print('INF starting tunnel to http://127.0.0.1:' + sys.argv[1]);"
        "print('INF |  https://quiet-fox-123.trycloudflare.example  |', flush=True);"
        "time.sleep(60)"
    )
    command = [sys.executable, "-c", script, "{port}"]
    with expose_proxy(PROXY, sandbox="e2b", tunnel_command=command, timeout_s=20) as exposure:
        assert exposure.public_url == "https://quiet-fox-123.trycloudflare.example"
        assert exposure.agent_url(f"{PROXY}/s/x/v1") == (
            "https://quiet-fox-123.trycloudflare.example/s/x/v1"
        )
        assert exposure.tunnel is not None and exposure.tunnel.pid is not None
        pid = exposure.tunnel.pid
        assert _alive(pid)
        assert "41234" in "".join(exposure.tunnel.output)
    wait_until(lambda: not _alive(pid), f"the tunnel process {pid} to die after close()",
               timeout_s=60)


def test_a_tunnel_that_exits_without_a_url_fails_with_its_output():
    command = [sys.executable, "-c", "print('error: not logged in'); raise SystemExit(3)"]
    with pytest.raises(ExposeError, match="not logged in"):
        expose_proxy(PROXY, sandbox="modal", tunnel_command=command, timeout_s=20)


def test_a_tunnel_that_prints_no_url_in_time_is_killed():
    command = [
        sys.executable,
        "-c",
        "import time; print('connecting...', flush=True); time.sleep(60)",
    ]
    started = time.monotonic()
    with pytest.raises(ExposeError, match="no public URL within 1s"):
        expose_proxy(PROXY, sandbox="docker", tunnel_command=command, timeout_s=1)
    assert time.monotonic() - started < 45  # killed at its 1 s timeout, not after its 60 s sleep


# --- the proxy a rollout process runs for its sandboxes (harness.service.local_proxy) ----------

def test_a_rollout_processs_proxy_hands_agents_the_public_url_and_stops_with_its_exposure():
    import httpx

    from harness.service.local_proxy import start_local_proxy

    # the engine is never called: nothing listens on port 9
    with start_local_proxy("http://127.0.0.1:9", sandbox="daytona",
                           public_url="https://proxy.example.org/") as proxy:
        assert proxy.exposure is not None
        assert proxy.server.state.public_url == proxy.exposure.public_url
        assert proxy.exposure.public_url == "https://proxy.example.org/"
        url = proxy.server.url
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/health", timeout=2)


def test_a_refused_exposure_stops_the_proxy_it_started(monkeypatch: pytest.MonkeyPatch):
    from capture.server import CaptureServer
    from harness.service.local_proxy import start_local_proxy

    stopped = []
    stop = CaptureServer.stop
    monkeypatch.setattr(CaptureServer, "stop", lambda self: (stopped.append(self.url), stop(self)))
    with pytest.raises(ExposeError, match=r"--proxy-public-url.*--proxy-tunnel"):
        start_local_proxy("http://127.0.0.1:9", sandbox="e2b")
    assert len(stopped) == 1
