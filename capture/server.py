"""`CaptureServer`: the capture proxy as an object (uvicorn in a background thread).

    with CaptureServer("http://127.0.0.1:8011", data_dir=Path("runs/capture")) as proxy:
        client = CaptureClient(proxy.url, proxy.admin_key)
        info = client.create_session(sampling={"temperature": 1.0})
        ...  # point an agent at info.base_urls["chat"] with info.secret as its API key
        trace = client.training_trace(info.session_id)

The same app runs standalone as `python -m capture` (see `__main__`). The socket is bound before
the thread starts, so `.url` is known (and `port=0` resolved) the moment `start()` returns, and a
port clash fails in the caller's thread with the OS error instead of inside uvicorn's.

Binds 127.0.0.1 unless told otherwise: a capture proxy is an open door to the engine for whoever
holds a session secret, and to every trace for whoever holds the admin key. The admin key is
generated (secrets.token_urlsafe) when not given.

On a non-loopback address (the HF Jobs launcher's 0.0.0.0) the admin routes are not served there:
they get their own listener on 127.0.0.1 (`admin_port`, 0 = any free one), served by the same
server and event loop, and `admin_url` is where to reach them (on loopback, `admin_url == url`).
`admin_on_public=True` serves them on the public address too (`False` gives them their own
listener even on loopback). Every listener runs capture.guard's checks (`limits`).
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from types import TracebackType

from launchers.net import is_loopback

from .app import create_app
from .serving import ThreadedUvicorn
from .state import Limits

__all__ = ["CaptureServer"]

logger = logging.getLogger(__name__)


class CaptureServer:
    """The capture proxy in-process. `.start()` / `.stop()` or use as a context manager."""

    def __init__(
        self,
        engine_url: str,
        *,
        admin_key: str | None = None,
        data_dir: Path | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        max_body_bytes: int | None = None,
        upstream_timeout_s: float = 600.0,
        public_url: str | None = None,
        limits: Limits | None = None,
        fsync: str = "interval",
        fsync_interval_s: float = 1.0,
        admin_port: int = 0,
        admin_on_public: bool | None = None,
    ) -> None:
        """`limits`: capture.guard; `fsync` / `fsync_interval_s`: capture.calllog's durability
        policy; `admin_port` / `admin_on_public`: the module docstring (None: a separate admin
        listener exactly when `host` is not loopback; False: always one; True: never)."""
        self.engine_url = engine_url
        self.admin_key = admin_key or secrets.token_urlsafe(32)
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.host = host
        self.port = port
        self.admin_port = admin_port
        self.separate_admin = (not is_loopback(host) if admin_on_public is None
                               else not admin_on_public)
        self.app = create_app(
            engine_url,
            admin_key=self.admin_key,
            data_dir=self.data_dir,
            max_body_bytes=max_body_bytes,
            upstream_timeout_s=upstream_timeout_s,
            public_url=public_url,
            limits=limits,
            fsync=fsync,
            fsync_interval_s=fsync_interval_s,
        )
        self.limits: Limits = self.state.limits
        self._runner: ThreadedUvicorn | None = None

    @property
    def url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::") else "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def admin_url(self) -> str:
        """Where the admin routes are served (== `url` unless the proxy binds a public address)."""
        if not self.separate_admin:
            return self.url
        return f"http://127.0.0.1:{self.admin_port}"

    @property
    def state(self):  # noqa: ANN201 - CaptureState; for tests and the benchmark
        return self.app.state.capture

    def start(self, timeout_s: float = 30.0) -> CaptureServer:
        runner = ThreadedUvicorn(
            self.app, self.host, self.port, limits=self.limits,
            also=("127.0.0.1", self.admin_port) if self.separate_admin else None)
        self.port = runner.start(timeout_s)
        self._runner = runner
        if self.separate_admin:
            self.admin_port = runner.also_port or 0
            self.state.admin_port = self.admin_port
            self.state.agent_url = self.url
        logger.info("capture proxy serving on %s (admin on %s) -> engine %s", self.url,
                    self.admin_url, self.engine_url)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._runner is not None:
            self._runner.stop(timeout_s)
            self._runner = None

    def __enter__(self) -> CaptureServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
