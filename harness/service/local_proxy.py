"""`start_local_proxy`: the capture proxy a rollout process runs for its own sandboxes.

Both processes that run rollouts start one the same way: the rollout service
(`python -m harness.serve`, harness.service.state) and harness.eval, which runs its rollouts in
its own process. A capture proxy on the engine (its per-call log under `data_dir`), and for a
remote sandbox (E2B, Docker, ...) its exposure (harness.service.sandboxes.expose: a public URL
or a tunnel), whose URL then becomes the one session base URLs hand to agents. The trainer's
process never starts one: it starts a rollout service instead (harness.run.stack).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from capture.server import CaptureServer
    from harness.service.sandboxes.expose import ProxyExposure

__all__ = ["LocalProxy", "start_local_proxy"]


@dataclass
class LocalProxy:
    """A started proxy and, for remote sandboxes, its exposure; `stop()` ends both."""

    server: CaptureServer
    exposure: ProxyExposure | None = None

    def stop(self) -> None:
        if self.exposure is not None:
            self.exposure.close()
        self.server.stop()

    def __enter__(self) -> LocalProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_local_proxy(engine_url: str, *, sandbox: str, data_dir: Path | None = None,
                      host: str = "127.0.0.1", port: int = 0, public_url: str | None = None,
                      tunnel: str | None = None) -> LocalProxy:
    """A CaptureServer on `engine_url`, started, and exposed to `sandbox` unless it is local
    (--proxy-public-url or --proxy-tunnel; harness.service.sandboxes.ExposeError names both)."""
    from capture.server import CaptureServer

    server = CaptureServer(engine_url, data_dir=data_dir, host=host, port=port,
                           public_url=public_url)
    server.start()
    if sandbox == "local":
        return LocalProxy(server)
    from harness.service.sandboxes.expose import expose_proxy

    try:
        exposure = expose_proxy(server.url, sandbox=sandbox, public_url=public_url,
                                tunnel_command=tunnel)
    except BaseException:
        server.stop()
        raise
    # Session base URLs handed to agents must be the public ones (a tunnel's is only known once
    # it is up).
    server.state.public_url = exposure.public_url
    return LocalProxy(server, exposure)
