"""A bare relay: the floor under the capture proxy's own stack, for the benchmark.

It forwards each chat request's bytes to the engine unparsed and returns the engine's reply bytes
unparsed: no JSON, no translation, no recording, no auth. It runs on what the proxy's model calls
run on (uvicorn behind capture.guard's `GuardedHTTP`, the route taken before Starlette's routing,
aiohttp to the engine through the proxy's own tuned session, `capture.upstream`), so whatever
latency it adds over calling the engine directly is the cost of one more HTTP hop through that
stack on this machine, which the capture cannot go below; the benchmark prints it beside ours.

    .venv/bin/python bench/capture/relay.py --engine-url http://127.0.0.1:8400 --port 8500
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capture.guard import Limits
from capture.serving import ThreadedUvicorn, read_body
from capture.upstream import EngineClient


class Relay(Starlette):
    """POST .../v1/chat/completions is forwarded before Starlette's routing; /health is served by
    Starlette."""

    def __init__(self, engine_url: str) -> None:
        async def health(request: Request) -> Response:
            return Response(b"{}", media_type="application/json")

        super().__init__(routes=[Route("/health", health)])
        self.engine = EngineClient(engine_url)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or not scope["path"].endswith("/v1/chat/completions")):
            await super().__call__(scope, receive, send)
            return
        body = await read_body(receive)
        content = await self.engine.complete_raw(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", b"%d" % len(content))]})
        await send({"type": "http.response.body", "body": content})


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/capture/relay.py")
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ThreadedUvicorn(Relay(args.engine_url.rstrip("/")), port=args.port, limits=Limits()).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
