"""`python -m capture --engine-url URL[,URL...] [--host] [--port] [--data-dir] [--admin-key-file]`.

Runs the capture proxy in the foreground until SIGINT/SIGTERM. The admin key is read from
`--admin-key-file` when that file exists, otherwise generated and written there (mode 0600); with
no file it goes to `<data-dir>/admin.key`, or with no data dir to a new private (0700) temporary
folder. The key is never printed: the proxy prints the file's path. Binds 127.0.0.1 by default; on
any other address the admin routes are served only on 127.0.0.1:--admin-port (printed), unless
--admin-on-public (capture.server, capture.guard).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
from pathlib import Path

from .calllog import FSYNC_POLICIES
from .server import CaptureServer
from .state import Limits


def _default_key_file(data_dir: Path | None) -> Path:
    """Where a generated key goes when no file is named: only its owner can read it."""
    if data_dir is not None:
        return data_dir / "admin.key"
    return Path(tempfile.mkdtemp(prefix="capture-")) / "admin.key"


def _admin_key(path: Path) -> str:
    """Read the key from the file, or generate one and write it there with mode 0600."""
    if path.is_file():
        key = path.read_text().strip()
        if not key:
            raise SystemExit(f"admin key file {path} is empty; delete it to generate a new key")
        return key
    key = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(key + "\n")
    return key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m capture", description=__doc__.split("\n")[0])
    parser.add_argument("--engine-url", required=True,
                        help="vLLM server root, e.g. http://127.0.0.1:8000; several as "
                             "URL,URL,...: each session is pinned to one (the least loaded live "
                             "one), and an engine that dies is left (capture.engines)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8300, help="port (0 picks a free one)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="persist sessions and call logs here; a restart recovers them")
    parser.add_argument("--admin-key-file", type=Path, default=None,
                        help="read the admin key from this file, or write a new one there (0600); "
                             "default <data-dir>/admin.key, or a new private temporary folder")
    parser.add_argument("--max-body-mb", type=int, default=32, help="largest agent request body")
    parser.add_argument("--upstream-timeout-s", type=float, default=600.0,
                        help="longest the engine may stay silent while a reply is owed, time the "
                             "proxy waits on a slow agent not counted (default 600)")
    parser.add_argument("--public-url", default=None,
                        help="URL agents reach the proxy at, if not the one they call admin on")
    parser.add_argument("--fsync", choices=FSYNC_POLICIES, default="interval",
                        help="call-log durability (capture.calllog): fsync every interval "
                             "(default), after every call, or never")
    parser.add_argument("--fsync-interval-s", type=float, default=1.0)
    parser.add_argument("--admin-port", type=int, default=0,
                        help="admin listener port on 127.0.0.1 when --host is not loopback "
                             "(0 picks a free one)")
    parser.add_argument("--admin-on-public", action="store_true", default=None,
                        help="also serve the admin routes on --host (not advised on a public port)")
    defaults = Limits()
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections)
    parser.add_argument("--header-timeout-s", type=float, default=defaults.header_timeout_s)
    parser.add_argument("--body-timeout-s", type=float, default=defaults.body_timeout_s)
    parser.add_argument("--max-session-mb", type=int,
                        default=defaults.max_session_bytes // (1024 * 1024),
                        help="recorded token memory per session before its calls are refused")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")

    key_file = args.admin_key_file or _default_key_file(args.data_dir)
    key = _admin_key(key_file)
    server = CaptureServer(
        args.engine_url,
        admin_key=key,
        data_dir=args.data_dir,
        host=args.host,
        port=args.port,
        upstream_timeout_s=args.upstream_timeout_s,
        public_url=args.public_url,
        limits=Limits(max_connections=args.max_connections,
                      header_timeout_s=args.header_timeout_s,
                      body_timeout_s=args.body_timeout_s,
                      max_body_bytes=args.max_body_mb * 1024 * 1024,
                      max_session_bytes=args.max_session_mb * 1024 * 1024),
        fsync=args.fsync,
        fsync_interval_s=args.fsync_interval_s,
        admin_port=args.admin_port,
        admin_on_public=args.admin_on_public,
    )
    server.start()
    print(f"capture proxy on {server.url} -> {args.engine_url}", flush=True)
    if server.admin_url != server.url:
        print(f"admin routes on {server.admin_url}", flush=True)
    print(f"admin key in {key_file}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
