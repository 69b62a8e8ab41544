"""`python -m harness.serve`: rollouts as a service, so the trainer's process holds no harbor.

Why it exists: vLLM (whose NCCL weight-transfer engine the trainer imports on GPUs) cannot share an
environment with openenv, and one host cannot carry hundreds of agents, their proxy traffic and
their verifiers beside the trainer. This process owns everything on the rollout side (tasks,
sandboxes, agents, the capture proxy, the verifier) through the one implementation of rollouts,
`HarborSessionFactory`; the trainer reaches it with `harness.client.remote.RemoteSessionFactory`.

    python -m harness.serve --engine-url http://127.0.0.1:8000 [--tasks bundled] [--port 8200]
        [--sandbox e2b --proxy-host 0.0.0.0 --proxy-port 8100 --proxy-public-url URL]
    -> prints one JSON line {"url", "pid", "proxy"} (never the key; --ready-file gets the key
       too, written 0600 in a 0700 folder); every route but /health wants
       "Authorization: Bearer <key>" (the key: --key-file, $HARNESS_SERVICE_KEY, or made up)
    It serves behind the capture proxy's guard (capture.guard: head size and read time, body
    size and read time, connection cap), and keeps an idle connection KEEP_ALIVE_S, far past
    the client's 5 s (httpx's pool): at uvicorn's default of 5 s both ends close an idle
    connection at the same moment, and a request sent on it then is lost with it.

Where it runs: from the project venv (.venv: harbor, openenv), never in the trainer's process.
`python -m harness.train` starts one itself (`spawn_service`, pointed at the engine it launched,
sharing the run's cache, its proxy's per-call log under <output-dir>/capture) unless given
--rollout-service URL[,URL...]; launchers/hf_jobs.py starts one beside the GPU trainer (which
runs from .trainer-venv); on other hosts, start as many as the sandboxes need and list them all.
For remote sandboxes (--sandbox other than local) the proxy is exposed at --proxy-public-url or
through --proxy-tunnel, as harness.train did for its in-process proxy.

Routes (JSON). A body's `factory` is the client's factory options (split, harness, sandbox,
model, sampling, max_tokens, limits); the service keeps one HarborSessionFactory per distinct set.

    GET    /health                      {"ok", "in_flight", "max_sessions"}
    GET    /metrics                     rollouts by cause, retries, admitted, rejected, timings
    POST   /v1/weight_version           {"version"}: the engine's weights changed (every proxy)
    POST   /v1/tasks                    {split, task_count} -> {"tasks": names, in seed order}
                                        | 400 naming the fix (a client's settings check)
    POST   /v1/rollouts                 {factory, task, seed, episode_id, weight_version,
                                        request_id} -> 202 {"id"} | 429; the same request_id
                                        again (its answer lost) gets the same id, no 2nd run
    GET    /v1/rollouts/{id}?wait_s=N   long poll -> {"done": false} | {"done": true, "result"};
                                        a handed-over result answers polls for a minute more
    DELETE /v1/rollouts/{id}            cancel (if running) and forget
    POST   /v1/sessions                 {factory, task, seed, episode_id, request_id}
                                        -> {"id", "task_id"} | 429; the same request_id again
                                        gets the same session
    POST   /v1/sessions/{id}/wait       {"timeout_s", "wait_s"} long poll -> {"done", "exit_code"}
    GET    /v1/sessions/{id}/trace      {"trace": TrainingTrace dump, "entries": trace entries}
    POST   /v1/sessions/{id}/verify     {"transcript"} -> VerifyResult fields; graded once, a
                                        verify sent again gets the same verdict
    DELETE /v1/sessions/{id}            close (sandbox, agent, proxy session), idempotent

Admission: at most `--max-sessions` rollouts plus open sessions at once; beyond that 429 with a
Retry-After (seconds) and nothing queued, so a client spreads the load or waits, and one service
never buffers an unbounded backlog. A session failure is answered 422 with {"error": {type,
cause, retryable, message}} so the client raises the same `harness.shared.errors` class.

Results: a finished rollout's result stays until the client fetched it (or DELETEs it); results
nobody fetched are forgotten `--result-ttl-s` after they finished, and a session no client called
for `--result-ttl-s` is closed (its client gone), so neither holds memory or a slot for good.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from harness.client.spawn import KEY_ENV, LocalService, spawn_service
from harness.service.routes import create_app
from harness.service.state import RolloutService

# LocalService and spawn_service: tests/service_helpers.py imports them from here
__all__ = ["KEEP_ALIVE_S", "LocalService", "build_parser", "main", "spawn_service", "write_ready"]

log = logging.getLogger("harness.serve")
KEEP_ALIVE_S = 120  # an idle connection's life here (the capture proxy's too: capture.serving)


def write_ready(path: Path, ready: dict[str, Any]) -> None:
    """Write the ready file (it holds the key) readable by its owner only, atomically (a reader
    never sees half of it), in a folder only its owner can enter: made 0700 if missing, and
    refused if it exists and others can enter or write it."""
    folder = path.parent
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    mode = folder.stat().st_mode & 0o777
    if mode & 0o077:
        raise SystemExit(f"--ready-file {path}: its folder {folder} is open to other users "
                         f"(mode {mode:o}); the file holds the service key. Put it in a folder "
                         "of mode 0700 (chmod 700)")
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(ready))
    tmp.replace(path)


# ---- command line --------------------------------------------------------------------------------


def _key(args: argparse.Namespace) -> str:
    if args.key_file:
        key = Path(args.key_file).read_text().strip()
        if not key:
            raise SystemExit(f"--key-file {args.key_file} is empty; write the service key in it")
        return key
    return os.environ.get(KEY_ENV) or secrets.token_urlsafe(32)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser("python -m harness.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine-url", required=True,
                   help="the vLLM engine the capture proxy fronts; several as URL,URL,...: each "
                        "session is pinned to one, the least loaded live one (capture.engines)")
    p.add_argument("--tasks", default="bundled", help="default split (harness.tasks spec)")
    p.add_argument("--task-count", type=int, default=None)
    p.add_argument("--max-sessions", type=int, default=8,
                   help="rollouts + open sessions admitted at once; beyond: 429 + Retry-After")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8200, help="0 picks a free port")
    p.add_argument("--key-file", default=None, help=f"the bearer key (else ${KEY_ENV}, else new)")
    p.add_argument("--data-dir", default=None, help="the capture proxy's per-call log lives here")
    p.add_argument("--ready-file", default=None,
                   help="write {url, key} here once serving (0600; its folder must be 0700)")
    p.add_argument("--result-ttl-s", type=float, default=3600.0,
                   help="forget a finished rollout's result nobody fetched, and close a session "
                        "nobody called, after this many seconds")
    p.add_argument("--sandbox", default="local",
                   help="the sandboxes the capture proxy is exposed to (a remote one needs "
                        "--proxy-public-url or --proxy-tunnel)")
    p.add_argument("--proxy-host", default="127.0.0.1",
                   help="the capture proxy's agent address (0.0.0.0 only behind a public URL; "
                        "its admin routes then stay on loopback)")
    p.add_argument("--proxy-port", type=int, default=0, help="the capture proxy's port (0: free)")
    p.add_argument("--proxy-public-url", default=None,
                   help="the URL remote sandboxes use to reach the capture proxy")
    p.add_argument("--proxy-tunnel", default=None,
                   help="a command that opens a tunnel to the proxy, with {url}")
    return p


async def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: anyone who can reach it and holds the key can run rollouts",
                    args.host)
    service = RolloutService(
        args.engine_url, key=_key(args), tasks=args.tasks, task_count=args.task_count,
        max_sessions=args.max_sessions, result_ttl_s=args.result_ttl_s,
        data_dir=Path(args.data_dir) if args.data_dir else None, proxy_host=args.proxy_host,
        proxy_port=args.proxy_port, proxy_public_url=args.proxy_public_url,
        proxy_tunnel=args.proxy_tunnel, sandbox=args.sandbox)
    service.start()
    from capture.guard import Limits, guard_app, server_options

    # The proxy's guard (capture.guard): h11's bound on a head, a head's read time, a body's size
    # and read time, the connection cap. Bodies here are small JSON (a transcript to verify).
    limits = Limits(max_body_bytes=16 * 1024 * 1024)
    config = uvicorn.Config(guard_app(create_app(service), limits), host=args.host,
                            port=args.port, log_level="warning", timeout_graceful_shutdown=5,
                            timeout_keep_alive=KEEP_ALIVE_S,
                            proxy_headers=False, **server_options(limits))
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            await serving  # raises why it could not bind
            raise SystemExit("the rollout service stopped before it served")
        await asyncio.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    host = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
    ready = {"url": f"http://{host}:{port}", "pid": os.getpid(), "proxy": service.proxy.url}
    if args.ready_file:
        write_ready(Path(args.ready_file), {**ready, "key": service.key})
    # The key is never printed: this line lands in logs (spawn_service's service.log).
    print(json.dumps(ready), flush=True)
    try:
        await serving
    finally:
        await service.stop()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    from harness.tasks import quiet_harbor

    quiet_harbor()
    try:
        asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
