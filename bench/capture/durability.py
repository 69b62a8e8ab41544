"""What the call log's durability policy costs a call (capture/calllog.py; issue 15, item 5).

One agent session of coding turns (a ~28 KB system prompt, a tool call and a ~1 KB tool result
per turn, as bench.py's workload), sent through an in-process proxy in front of the in-package
fake engine, once per policy: no data dir (nothing logged), and a data dir with fsync "never",
"interval" and "call". The calls are sequential: the agent's next call is handled only after the
previous one was recorded, so an fsync on the event loop ("call") shows in its latency. Then the
append alone: the session's own call lines appended again to a fresh log on the same filesystem.
Not a test; it prints figures.

    .venv/bin/python bench/capture/durability.py [--turns 60] [--dir /path/on/the/disk/to/measure]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from capture import CaptureClient, CaptureServer  # noqa: E402
from capture.calllog import CallLog, read_records  # noqa: E402
from capture.fake_engine import FakeEngine  # noqa: E402

SYSTEM = "You are a coding agent working in a repository. " * 580  # ~28 KB
TOOLS = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x" * 200,
                                           "parameters": {"type": "object"}}} for i in range(10)]


def session_latencies(engine: str, data_dir: Path | None, policy: str, turns: int
                      ) -> tuple[list[float], Path | None]:
    with CaptureServer(engine, data_dir=data_dir, fsync=policy) as proxy, httpx.Client(
            timeout=60) as http:
        info = CaptureClient(proxy.url, proxy.admin_key).create_session()
        url = f"{info.base_urls['chat']}/chat/completions"
        headers = {"authorization": f"Bearer {info.secret}"}
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix"}]
        latencies = []
        for turn in range(turns):
            started = time.perf_counter()
            reply = http.post(url, headers=headers,
                              json={"model": "m", "messages": messages, "tools": TOOLS})
            latencies.append(time.perf_counter() - started)
            message = reply.json()["choices"][0]["message"]
            messages += [{k: message[k] for k in ("role", "content", "tool_calls") if k in message},
                         {"role": "tool", "tool_call_id": f"call_{turn}",
                          "content": f"result {turn} " + "y" * 1000}]
        log = proxy.state.store.get(info.session_id).log_path
    return latencies, log


def append_costs(lines: list[dict], folder: Path, policy: str) -> list[float]:
    log = CallLog(folder / f"append-{policy}.jsonl", policy)
    costs = []
    for record in lines:
        started = time.perf_counter()
        log.append(record)
        costs.append(time.perf_counter() - started)
    log.close()
    return costs


def ms(values: list[float], q: float | None = None) -> str:
    if q is None:
        return f"{statistics.median(values) * 1000:.3f}"
    return f"{sorted(values)[int(q * (len(values) - 1))] * 1000:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to put the logs (default: a temporary folder)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="capture-durability-", dir=args.dir))
    print(f"logs under {base} (filesystem of the data dir measured); {args.turns} turns")
    with FakeEngine() as fake:
        session_latencies(fake.url, None, "never", 5)  # warm-up: imports, first connections
        rows = []
        log_path = None
        for name, policy in (("no data dir", "never"), ("never", "never"),
                             ("interval", "interval"), ("call", "call")):
            data_dir = None if name == "no data dir" else base / name
            latencies, log = session_latencies(fake.url, data_dir, policy, args.turns)
            log_path = log or log_path
            rows.append((name, latencies))
    records, _ = read_records(log_path)
    calls = [r for r in records if r.get("kind") == "call"]
    size = sum(len(line) for line in log_path.read_bytes().splitlines()) / max(1, len(calls))
    print("\n| fsync policy | call latency p50 ms | p90 ms |")
    print("|---|---:|---:|")
    for name, latencies in rows:
        print(f"| {name} | {ms(latencies)} | {ms(latencies, 0.9)} |")
    print(f"\nappend alone ({len(calls)} call lines, {size / 1024:.1f} KB each on average):")
    print("| fsync policy | append p50 ms | p90 ms |")
    print("|---|---:|---:|")
    for policy in ("never", "interval", "call"):
        costs = append_costs(calls, base, policy)
        print(f"| {policy} | {ms(costs)} | {ms(costs, 0.9)} |")


if __name__ == "__main__":
    main()
