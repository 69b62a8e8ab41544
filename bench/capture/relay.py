"""A bare relay: the floor under the capture proxy's own stack, for the benchmark.

It forwards each chat request's bytes to the engine unparsed and returns the engine's reply bytes
unparsed: no JSON, no translation, no recording, no auth. It runs on what the proxy's model calls
run on (uvicorn with `capture.fast_lane` serving its model-call route, a Starlette app for the
rest, `capture.engine_http` out), so whatever latency it adds over
calling the engine directly is the cost of one more HTTP hop through that stack on this machine,
which the capture cannot go below; the benchmark prints it beside ours.

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

from capture.engine_http import EngineHTTP
from capture.serving import ThreadedUvicorn, read_body


class Relay(Starlette):
    """POST /s/{id}/v1/chat/completions is forwarded in the server's fast lane (or, reaching the
    app, before Starlette's routing); /health is served by Starlette."""

    def __init__(self, engine_url: str) -> None:
        async def health(request: Request) -> Response:
            return Response(b"{}", media_type="application/json")

        super().__init__(routes=[Route("/health", health)])
        self.engine = EngineHTTP.for_url(engine_url)

    def fast_lane(self, path: str) -> Any:
        return self.forward if path.endswith("/v1/chat/completions") else None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not self.fast_lane(scope["path"]):
            await super().__call__(scope, receive, send)
            return
        await self.forward(scope, receive, send)

    async def forward(self, scope: Any, receive: Any, send: Any) -> None:
        body = await read_body(receive)
        reply = await self.engine.request("POST", "/v1/chat/completions", body, whole=True)
        content = await reply.read()
        response = Response(content, status_code=reply.status, media_type="application/json")
        await response(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/capture/relay.py")
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    relay = Relay(args.engine_url.rstrip("/"))
    ThreadedUvicorn(relay, port=args.port, fast_lane=(relay.fast_lane, 32 << 20)).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
