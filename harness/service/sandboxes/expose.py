"""`--sandbox` names -> Harbor environments, and making the capture proxy reachable from them.

The local sandbox reaches the proxy through a loopback forward (ports.py). A remote sandbox
(Docker, E2B, Daytona, Modal: Harbor's own backends) runs elsewhere, where the proxy's
http://127.0.0.1:PORT means nothing. So a remote run needs one of:

    public_url       a URL the user already has that reaches the proxy (a reverse proxy, a
                     cloud VM's address with the proxy bound to 0.0.0.0, host.docker.internal)
    tunnel_command   a command that opens a tunnel to the proxy and prints its public URL,
                     e.g. "cloudflared tunnel --url {url}" or "ssh -R 80:localhost:{port} serveo.net";
                     {url}, {host} and {port} are the proxy's. The first http(s) URL it prints
                     (other than the proxy's own) is taken; the process lives until close().

and `ProxyExposure.agent_url()` rewrites each session's proxy URL to the public one. Exposing the
proxy is safe only because every agent route needs its session's secret and admin routes need
the admin key (capture/); nothing here weakens that.

It refuses to guess: a remote backend without public_url or tunnel_command, or with a loopback
public_url, is an ExposeError naming both options.
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from harness.service.sandboxes.errors import ExposeError
from harness.service.sandboxes.ports import sandbox_url

__all__ = [
    "SANDBOX_BACKENDS",
    "ProxyExposure",
    "SandboxBackend",
    "Tunnel",
    "backend_problems",
    "environment_config",
    "expose_proxy",
]

LOCAL_IMPORT_PATH = "harness.service.sandboxes.bwrap:BwrapEnvironment"


@dataclass(frozen=True)
class SandboxBackend:
    """One `--sandbox` choice: which Harbor environment it is and what it needs."""

    name: str
    environment_type: str | None  # Harbor EnvironmentType value, or None for an import path
    import_path: str | None
    remote: bool  # the proxy must be exposed (the sandbox is not on this host's loopback)
    preinstalled_agents: bool  # agents come from host binds (Harbor's skip-install) vs Harbor
    credentials: tuple[str, ...] = field(default_factory=tuple)  # env vars, any one suffices


SANDBOX_BACKENDS: dict[str, SandboxBackend] = {
    "local": SandboxBackend("local", None, LOCAL_IMPORT_PATH, False, True),
    "docker": SandboxBackend("docker", "docker", None, True, False),
    "podman": SandboxBackend("podman", "podman", None, True, False),
    "e2b": SandboxBackend("e2b", "e2b", None, True, False, ("E2B_API_KEY",)),
    "daytona": SandboxBackend("daytona", "daytona", None, True, False, ("DAYTONA_API_KEY",)),
    "modal": SandboxBackend("modal", "modal", None, True, False, ("MODAL_TOKEN_ID",)),
}


def _backend(name: str) -> SandboxBackend:
    try:
        return SANDBOX_BACKENDS[name]
    except KeyError:
        known = ", ".join(SANDBOX_BACKENDS)
        raise ExposeError(f"unknown --sandbox {name!r}: choose one of {known}") from None


def backend_problems(name: str) -> list[str]:
    """Everything missing for `--sandbox name` on this host (empty when it should work)."""
    backend = _backend(name)
    problems: list[str] = []
    if name == "local":
        from harness.service.sandboxes.local_launch import check_bwrap_available

        try:
            check_bwrap_available()
        except Exception as exc:
            problems.append(str(exc))
    if name in ("docker", "podman") and shutil.which(name) is None:
        problems.append(f"the {name} CLI is not on PATH")
    if name == "docker" and not os.path.exists("/var/run/docker.sock"):
        problems.append("no docker daemon socket at /var/run/docker.sock (start dockerd)")
    if backend.credentials and not any(os.environ.get(v) for v in backend.credentials):
        problems.append(f"--sandbox {name} needs {' or '.join(backend.credentials)} in the env")
    return problems


def environment_config(sandbox: str, *, kwargs: dict[str, Any] | None = None, **fields: Any):
    """Harbor's trial `EnvironmentConfig` for a `--sandbox` name (type or import path)."""
    from harbor.models.trial.config import EnvironmentConfig

    backend = _backend(sandbox)
    if backend.import_path is not None:
        return EnvironmentConfig(import_path=backend.import_path, kwargs=kwargs or {}, **fields)
    return EnvironmentConfig(type=backend.environment_type, kwargs=kwargs or {}, **fields)


class Tunnel:
    """A tunnel process that prints a public URL for the proxy; killed (its group) on close()."""

    URL_RE = re.compile(r"https?://[A-Za-z0-9.\-]+(?::\d+)?[^\s'\"<>|]*")

    def __init__(self, command: str | list[str], *, local_url: str, timeout_s: float = 60.0):
        parts = urlsplit(local_url)
        values = {"url": local_url, "host": parts.hostname or "", "port": str(parts.port or "")}
        if isinstance(command, str):
            command = shlex.split(command)
        self.argv = [arg.format(**values) for arg in command]
        self.local_url = local_url
        self.timeout_s = timeout_s
        self.output: list[str] = []
        self.public_url: str | None = None
        self._proc: subprocess.Popen[str] | None = None

    def start(self) -> str:
        try:
            self._proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
        except OSError as exc:
            raise ExposeError(f"tunnel command {self.argv[0]!r} could not start: {exc}") from exc
        lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._drain, args=(lines,), daemon=True).start()
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                self.close()
                raise ExposeError(
                    f"tunnel command exited ({self._proc.returncode}) before printing a public "
                    f"URL; its output: {''.join(self.output)[-1500:]!r}"
                )
            for url in self.URL_RE.findall(line):
                if not url.startswith(self.local_url.rstrip("/")):
                    self.public_url = url.rstrip(".,;")
                    return self.public_url
        self.close()
        raise ExposeError(
            f"tunnel command printed no public URL within {self.timeout_s:.0f}s; "
            f"its output: {''.join(self.output)[-1500:]!r}"
        )

    def _drain(self, lines: queue.Queue[str | None]) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self.output.append(line)
            del self.output[:-200]
            lines.put(line)
        lines.put(None)

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def close(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGTERM)
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        except ProcessLookupError:
            pass


@dataclass
class ProxyExposure:
    """How agents in one kind of sandbox reach the proxy; `agent_url` maps proxy URLs for them."""

    sandbox: str
    local_url: str
    public_url: str
    tunnel: Tunnel | None = None

    def agent_url(self, url: str) -> str:
        """A proxy URL (e.g. a session's base URL) as the agent in the sandbox must use it."""
        if self.sandbox == "local":
            return sandbox_url(url)
        local = self.local_url.rstrip("/")
        if not url.startswith(local):
            raise ExposeError(f"{url} is not under the exposed proxy {local}")
        return self.public_url.rstrip("/") + url[len(local) :]

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()

    def __enter__(self) -> ProxyExposure:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_loopback(url: str) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    return host in ("localhost", "::1", "0.0.0.0") or host.startswith("127.")


def expose_proxy(
    proxy_url: str,
    *,
    sandbox: str,
    public_url: str | None = None,
    tunnel_command: str | list[str] | None = None,
    timeout_s: float = 60.0,
) -> ProxyExposure:
    """Make the proxy at `proxy_url` reachable from `sandbox`; ExposeError names the options."""
    backend = _backend(sandbox)
    if not backend.remote:
        return ProxyExposure(sandbox, proxy_url, sandbox_url(proxy_url))
    if public_url:
        if urlsplit(public_url).scheme not in ("http", "https"):
            raise ExposeError(f"public URL {public_url!r} must be http(s)://...")
        if _is_loopback(public_url):
            raise ExposeError(
                f"public URL {public_url} is a loopback address, which a {sandbox} sandbox "
                "cannot reach: give an address reachable from it, or use a tunnel command"
            )
        return ProxyExposure(sandbox, proxy_url, public_url)
    if tunnel_command:
        tunnel = Tunnel(tunnel_command, local_url=proxy_url, timeout_s=timeout_s)
        return ProxyExposure(sandbox, proxy_url, tunnel.start(), tunnel)
    raise ExposeError(
        f"--sandbox {sandbox} runs outside this machine, so the capture proxy at {proxy_url} is "
        "not reachable from it. Pass a public URL that forwards to it (--proxy-public-url "
        "https://...; bind the proxy to 0.0.0.0 if that URL points straight at this host) or a "
        "tunnel command that prints one (--proxy-tunnel 'cloudflared tunnel --url {url}')."
    )
