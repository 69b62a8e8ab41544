"""A bare relay: the floor under the capture proxy's own stack, for the benchmark.

It forwards each chat request's bytes to the engine unparsed and returns the engine's reply bytes
unparsed: no JSON, no translation, no recording, no auth. It runs on what the proxy runs on
(uvicorn + Starlette in, `capture.engine_http` out), so whatever latency it adds over calling the
engine directly is the cost of one more HTTP hop through that stack on this machine, which the
capture cannot go below; the benchmark prints it beside ours.

    .venv/bin/python bench/capture/relay.py --engine-url http://127.0.0.1:8400 --port 8500
"""

from __future__ import annotations

import argparse
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from capture.engine_http import EngineHTTP
from capture.serving import ThreadedUvicorn


def relay_app(engine_url: str) -> Starlette:
    engine = EngineHTTP.for_url(engine_url)

    async def forward(request: Request) -> Response:
        body = await request.body()
        reply = await engine.request("POST", "/v1/chat/completions", body)
        content = await reply.read()
        return Response(content, status_code=reply.status, media_type="application/json")

    async def health(request: Request) -> Response:
        return Response(b"{}", media_type="application/json")

    return Starlette(routes=[Route("/s/{session}/v1/chat/completions", forward, methods=["POST"]),
                             Route("/health", health)])


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench/capture/relay.py")
    parser.add_argument("--engine-url", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    ThreadedUvicorn(relay_app(args.engine_url.rstrip("/")), port=args.port).start()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
