"""The capture benchmark's load: coding-agent sessions, the servers they hit, and how both are read.

Split from bench.py (which holds the scenarios and the figures they print). One agent session
resends its whole history each turn, a ~28 KB system prompt (~7k ids), ten tools, and a tool call
with a ~1 KB result appended per turn, as opencode does; `Target` says where its calls go (the
engine direct, our proxy, OpenEnv's). A server's CPU is read from /proc (schedstat, ns), so each
runs as its own process.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import orjson

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable

SYSTEM = ("You are opencode, an interactive CLI coding agent. Use the tools to read, edit and "
          "run code; keep answers short; never guess file contents. ") * 190  # ~28 KB
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"{name}: " + "does the thing it says, carefully. " * 6,
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string", "description": "file path"},
        "command": {"type": "string", "description": "shell command"}},
        "required": ["path"]}}}
    for name in ("bash", "read", "write", "edit", "glob", "grep", "list", "task", "todo", "fetch")]
TOOL_RESULT = "line of tool output: tests passed, 3 files changed, all good here\n" * 14  # ~1 KB


# --- processes --------------------------------------------------------------------------------
def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} did not come up")


def spawn(args: list[str], health: str) -> subprocess.Popen:
    process = subprocess.Popen(args, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(REPO)})
    wait_healthy(health)
    return process


def cpu_seconds(pid: int) -> float:
    """CPU time of all the process's threads, in ns resolution (schedstat), not 10 ms ticks."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that just ended
            continue
    return total / 1e9


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Target:
    """Where a session's calls go: a per-session base URL and headers."""

    name: str
    url: str
    pid: int | None
    kind: str  # "direct" | "ours" | "openenv"
    admin_key: str = ""

    async def session(self, http: aiohttp.ClientSession) -> tuple[str, dict[str, str]]:
        if self.kind == "direct":
            return f"{self.url}/v1", {}
        if self.kind == "ours":
            async with http.post(f"{self.url}/admin/sessions", json={
                    "sampling": {"temperature": 1.0}},
                    headers={"authorization": f"Bearer {self.admin_key}"}) as reply:
                data = await reply.json()
            return data["base_urls"]["chat"], {"authorization": f"Bearer {data['secret']}"}
        async with http.post(f"{self.url}/sessions",
                             json={"sampling": {"temperature": 1.0}}) as reply:
            data = await reply.json()
        return f"{self.url}/v1", {"authorization": f"Bearer {data['session_id']}"}


def client(connections: int = 512) -> aiohttp.ClientSession:
    """The load generator's HTTP client. aiohttp, not httpx: measured here at 64 concurrent
    sessions, httpx's AsyncClient spent 12 ms of CPU per request (its pool scans every
    connection) against ~2 ms for aiohttp, and on two cores the load generator's CPU is taken
    from the servers it measures."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=connections, ssl=False),
        timeout=aiohttp.ClientTimeout(total=600), auto_decompress=False)


# --- load -------------------------------------------------------------------------------------
async def call(http: aiohttp.ClientSession, base: str, headers: dict[str, str],
               messages: list[dict], stream: bool, tools: bool = True
               ) -> tuple[float, float, dict]:
    """One chat call; returns (latency, time to first byte, assistant message)."""
    body = orjson.dumps({"model": "fake", "messages": messages, "stream": stream,
                         **({"tools": TOOLS} if tools else {})})
    headers = {**headers, "content-type": "application/json"}
    started = time.perf_counter()
    async with http.post(f"{base}/chat/completions", data=body, headers=headers) as reply:
        if not stream:
            content = await reply.read()
            elapsed = time.perf_counter() - started
            reply.raise_for_status()
            return elapsed, elapsed, orjson.loads(content)["choices"][0]["message"]
        reply.raise_for_status()
        first = None
        parts = []
        async for data in reply.content.iter_any():
            if first is None:
                first = time.perf_counter() - started
            parts.append(data)
    elapsed = time.perf_counter() - started
    message: dict = {"role": "assistant", "content": None}
    for line in b"".join(parts).split(b"\n"):
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        chunk = orjson.loads(line[6:])
        for choice in chunk.get("choices") or []:
            calls = (choice.get("delta") or {}).get("tool_calls")
            if calls:
                message["tool_calls"] = [{k: c[k] for k in ("id", "type", "function")}
                                         for c in calls]
    return elapsed, first or 0.0, message


async def agent_session(http: aiohttp.ClientSession, target: Target, turns: int, stream: bool,
                        latencies: list[float]) -> None:
    """One agent: `turns` calls, each resending the history plus a tool call and its result."""
    base, headers = await target.session(http)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix the bug"}]
    for turn in range(turns):
        elapsed, _, message = await call(http, base, headers, messages, stream)
        latencies.append(elapsed)
        extend(messages, message, turn)


def extend(messages: list[dict], message: dict, turn: int) -> None:
    """The agent's next history: its last reply and the result of the tool it called."""
    messages += [{k: message[k] for k in ("role", "content", "tool_calls") if k in message},
                 {"role": "tool", "tool_call_id": f"call_{turn}", "content": TOOL_RESULT}]


def ms(values: list[float]) -> str:
    """The median, in milliseconds, for printing."""
    return f"{1000 * statistics.median(values):.2f}"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load(target: Target, sessions: int, turns: int, stream: bool) -> dict:
    latencies: list[float] = []
    async with client() as http:
        cpu0 = cpu_seconds(target.pid) if target.pid else 0.0
        started = time.perf_counter()
        await asyncio.gather(*(agent_session(http, target, turns, stream, latencies)
                               for _ in range(sessions)))
        wall = time.perf_counter() - started
        cpu = (cpu_seconds(target.pid) - cpu0) if target.pid else 0.0
    n = len(latencies)
    return {"rps": n / wall, "cpu_ms": 1000 * cpu / n, "p50": pct(latencies, 0.5),
            "p99": pct(latencies, 0.99), "n": n}
