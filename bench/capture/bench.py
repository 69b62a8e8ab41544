"""Capture proxy benchmark: a fast fake engine direct, through our proxy, through OpenEnv 0.10's.

Not a test: it prints figures. One run measures, for the same load:

  * 8 and 64 concurrent multi-turn coding-agent sessions (a ~28 KB system prompt = ~7k ids, ten
    tools, a tool call per turn and a ~1 KB tool result appended each turn), streaming and not:
    requests/s, proxy CPU per request (from /proc of the proxy process), p50/p99 latency added
    over direct, and the ratios ours/OpenEnv;
  * one session at a time (ten sessions of 15 turns, ~7-10k ids): the latency and CPU one call
    pays for the hop, each call paired with the same call sent direct, beside a bare relay's;
  * one 150-turn session (history grows to ~41k ids): added latency and CPU early vs late (does
    the per-call cost grow with the history?), proxy RSS growth, export time, and the worst
    latency another session sees while the export runs;
  * time to first byte of a streamed reply at 5 ms/token, direct vs each proxy.

Each server runs as its own process (fake engines, our proxy, OpenEnv's), so CPU is attributed.

    .venv/bin/python bench/capture/bench.py            # everything (~90 s on 2 cores)
    .venv/bin/python bench/capture/bench.py --quick    # fewer turns, no OpenEnv
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from agent_load import (  # the sibling module: this runs as a script, bench/capture/ on sys.path
    PY,
    REPO,
    SYSTEM,
    TOOL_RESULT,
    TOOLS,
    Target,
    call,
    client,
    cpu_seconds,
    extend,
    free_port,
    load,
    ms,
    pct,
    rss_mb,
    spawn,
)


# --- scenarios --------------------------------------------------------------------------------
async def concurrency(targets: list[Target], turns: int) -> None:
    print("\n== concurrent multi-turn sessions (fake engine, ~7k-id system prompt, 10 tools) ==")
    print(f"{'mode':>8} {'sess':>4} {'target':>8} {'req/s':>7} {'cpu ms/req':>10} "
          f"{'p50 ms':>7} {'p99 ms':>7} {'+p50 ms':>8} {'+p99 ms':>8}")
    for stream in (False, True):
        for sessions in (8, 64):
            results = {}
            for target in targets:
                results[target.name] = await load(target, sessions, turns, stream)
            direct = results["direct"]
            for name, r in results.items():
                print(f"{'stream' if stream else 'whole':>8} {sessions:>4} {name:>8} "
                      f"{r['rps']:7.1f} {r['cpu_ms']:10.2f} {1000 * r['p50']:7.1f} "
                      f"{1000 * r['p99']:7.1f} {1000 * (r['p50'] - direct['p50']):8.1f} "
                      f"{1000 * (r['p99'] - direct['p99']):8.1f}")
            if "openenv" in results:
                ours, theirs = results["ours"], results["openenv"]
                print(f"{'':>14} ours/openenv: throughput x{ours['rps'] / theirs['rps']:.2f}, "
                      f"cpu/req x{theirs['cpu_ms'] / max(ours['cpu_ms'], 1e-9):.2f} less")


async def paired(http: aiohttp.ClientSession, direct: tuple[str, dict[str, str]],
                 via: tuple[str, dict[str, str]], messages: list[dict], direct_first: bool
                 ) -> tuple[float, dict]:
    """One call sent `via` a hop and direct, back to back; returns (added latency, the reply's
    message). Callers alternate `direct_first`: the engine parses the second of a pair's
    identical bodies warm, and measured here that alone moves a pair's difference ~0.5 ms."""
    if direct_first:
        direct_s, _, _ = await call(http, *direct, messages, False)
    via_s, _, message = await call(http, *via, messages, False)
    if not direct_first:
        direct_s, _, _ = await call(http, *direct, messages, False)
    return via_s - direct_s, message


async def single_sessions(target: Target, direct: Target, relay: Target, sessions: int,
                          turns: int) -> None:
    """What one session's call pays for the hop, over many calls at a ~7.5k-id history:
    `sessions` fresh sessions of `turns` turns, one at a time, each call paired with its direct
    twin, through `target` and through the bare relay alike."""
    added: list[float] = []
    floor: list[float] = []
    cpu: list[float] = []
    relay_cpu: list[float] = []
    async with client(64) as http:
        direct_base = await direct.session(http)
        for _ in range(sessions):
            base, relay_base = await target.session(http), await relay.session(http)
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "fix the bug"}]
            for turn in range(turns):
                before = cpu_seconds(relay.pid) if relay.pid else 0.0
                extra, _ = await paired(http, direct_base, relay_base, messages, turn % 2 == 0)
                floor.append(extra)
                relay_cpu.append((cpu_seconds(relay.pid) - before) if relay.pid else 0.0)
                before = cpu_seconds(target.pid)
                extra, message = await paired(http, direct_base, base, messages, turn % 2 == 0)
                await asyncio.sleep(0.002)  # the recording done after answering is the call's
                cpu.append(cpu_seconds(target.pid) - before)
                added.append(extra)
                extend(messages, message, turn)

    print(f"\n== one session at a time through {target.name}: {sessions} sessions x {turns} "
          f"turns (~7-10k ids), each call paired with its direct twin ==")
    print(f"  added latency p50 {ms(added)} ms (p90 {1000 * pct(added, 0.9):.2f}); the bare "
          f"relay's {ms(floor)} ms; {len(added)} calls each")
    print(f"  CPU per call p50: {target.name} {ms(cpu)} ms, the relay {ms(relay_cpu)} ms")


async def long_session(target: Target, direct: Target, relay: Target, turns: int,
                       engine_pid: int) -> None:
    """One long session; each turn is sent through `target` and through the bare relay, each
    paired with the same call sent direct right before or right after it (the order alternates
    turn by turn, so neither side of a pair always meets the engine's caches warm from the
    other). Added latency is a pair's difference. The relay (relay.py: the proxy's stack,
    nothing parsed) gives the floor of one more hop, in latency and in CPU. The CPU each process
    spent is read around its own calls."""
    print(f"\n== one {turns}-turn session through {target.name} (history grows to "
          f"~{7 + 0.227 * turns:.0f}k ids) ==")
    async with client(64) as http:
        rss0 = rss_mb(target.pid)
        cpu0 = cpu_seconds(target.pid)
        bases = [await direct.session(http), await target.session(http),
                 await relay.session(http)]
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "fix the bug"}]
        added: list[float] = []
        floor: list[float] = []
        proxy_cpu: list[float] = []
        relay_cpu: list[float] = []
        engine_cpu: list[float] = []
        pending = None  # the proxy's CPU before its last call: that call's cost is read at the
        # start of the next turn, so the recording it does after answering is counted too
        for turn in range(turns):
            if pending is not None:
                proxy_cpu.append(cpu_seconds(target.pid) - pending)
            direct_first = turn % 2 == 0
            before_relay = cpu_seconds(relay.pid) if relay.pid else 0.0
            relay_added, _ = await paired(http, bases[0], bases[2], messages, direct_first)
            relay_cpu.append((cpu_seconds(relay.pid) - before_relay) if relay.pid else 0.0)
            floor.append(relay_added)
            pending, engine_before = cpu_seconds(target.pid), cpu_seconds(engine_pid)
            proxied_added, message = await paired(http, bases[0], bases[1], messages,
                                                  direct_first)
            # the engine's CPU for the proxied call and its direct twin: half is the proxied one
            engine_cpu.append((cpu_seconds(engine_pid) - engine_before) / 2)
            added.append(proxied_added)
            extend(messages, message, turn)
        await asyncio.sleep(0.05)
        proxy_cpu.append(cpu_seconds(target.pid) - pending)
        cpu = cpu_seconds(target.pid) - cpu0
        rss1 = rss_mb(target.pid)
        tenth = max(1, turns // 10)

        print(f"  added latency p50 (all turns) {ms(added)} ms; first {tenth} turns "
              f"{ms(added[:tenth])} ms, last {tenth} turns {ms(added[-tenth:])} ms")
        print(f"  (floor: a bare relay on the proxy's stack, nothing parsed, adds {ms(floor)} ms; "
              f"first {tenth} turns {ms(floor[:tenth])} ms, last {ms(floor[-tenth:])} ms)")
        early, late = ms(proxy_cpu[:tenth]), ms(proxy_cpu[-tenth:])
        own = [p - r for p, r in zip(proxy_cpu, relay_cpu, strict=True)]
        e_early, e_late = ms(engine_cpu[:tenth]), ms(engine_cpu[-tenth:])
        print(f"  CPU per call, first -> last {tenth} turns (p50): proxy {early} -> {late} ms "
              f"(x{float(late) / max(float(early), 1e-6):.1f}); the engine it fronts, parsing "
              f"the same bodies: {e_early} -> {e_late} ms "
              f"(x{float(e_late) / max(float(e_early), 1e-6):.1f}); the relay's "
              f"{ms(relay_cpu[:tenth])} -> {ms(relay_cpu[-tenth:])} ms")
        print(f"  CPU per call over the relay's (the capture's own work), first -> last {tenth} "
              f"turns (p50): {ms(own[:tenth])} -> {ms(own[-tenth:])} ms")
        print(f"  proxy CPU {1000 * cpu / turns:.2f} ms/call on average; "
              f"RSS {rss0:.1f} -> {rss1:.1f} MB (+{rss1 - rss0:.1f} MB for the live session)")
        if target.kind != "ours":
            return
        # export while another session keeps calling: how long, and does it block the loop?
        admin = {"authorization": f"Bearer {target.admin_key}"}
        async with http.get(f"{target.url}/admin/sessions", headers=admin) as reply:
            sessions = await reply.json()
        long_id = max(sessions["sessions"], key=lambda s: s["n_calls"])["session_id"]
        base, headers = await target.session(http)
        small = [{"role": "user", "content": "hi"}]
        probe_latencies: list[float] = []
        stop = asyncio.Event()

        async def probe() -> None:
            while not stop.is_set():
                elapsed, _, _ = await call(http, base, headers, small, False)
                probe_latencies.append(elapsed)

        baseline = []
        for _ in range(20):
            baseline.append((await call(http, base, headers, small, False))[0])
        task = asyncio.create_task(probe())
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        async with http.get(f"{target.url}/admin/sessions/{long_id}/trace",
                            headers=admin) as reply:
            content = await reply.read()
        export_s = time.perf_counter() - started
        stop.set()
        await task
        print(f"  export: {export_s * 1000:.0f} ms for {len(content) / 1e6:.1f} MB of trace "
              f"JSON; another session's calls meanwhile: worst {1000 * max(probe_latencies):.1f}"
              f" ms (vs {1000 * statistics.median(baseline):.1f} ms p50 idle), "
              f"{len(probe_latencies)} calls served during the export")
        # the same export with no other session calling: its own cost, client read included
        cpu_before, started = cpu_seconds(target.pid), time.perf_counter()
        async with http.get(f"{target.url}/admin/sessions/{long_id}/trace",
                            headers=admin) as reply:
            await reply.read()
        print(f"  export again with no other session calling: "
              f"{1000 * (time.perf_counter() - started):.0f} ms, proxy CPU "
              f"{1000 * (cpu_seconds(target.pid) - cpu_before):.0f} ms")


async def ttfb(targets: list[Target]) -> None:
    print("\n== time to first byte, streamed reply of 150 tokens at 5 ms/token ==")
    async with client() as http:
        for target in targets:
            base, headers = await target.session(http)
            firsts, totals = [], []
            for _ in range(5):
                # no tools: the fake answers 150 content tokens, one SSE event each
                total, first, _ = await call(
                    http, base, headers, [{"role": "user", "content": "hi"}], True, tools=False)
                firsts.append(first)
                totals.append(total)
            print(f"  {target.name:>8}: first byte {1000 * statistics.median(firsts):7.1f} ms, "
                  f"whole reply {1000 * statistics.median(totals):7.1f} ms")


def in_process(turns: int = 150) -> None:
    """Memory of a live session and the export's own build time, without HTTP or load noise."""
    import tracemalloc
    from array import array

    from capture.export import trace_json
    from capture.recorder import Capture
    from capture.sampling import SamplingPolicy
    from capture.sessions import Session
    from capture.tokens import IdText

    print(f"\n== in-process: one {turns}-turn session (7k-id root, +~230 ids and 16 sampled/turn) ==")
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    session = Session("bench", "secret", SamplingPolicy.from_dict(None))
    prompt = list(range(1000, 8000))
    for turn in range(turns):
        completion = array("i", range(50_000 + 16 * turn, 50_000 + 16 * turn + 16))
        capture = Capture(IdText.from_ids(prompt), completion, array("d", [-0.5] * 16), {},
                          {"role": "assistant", "content": None, "tool_calls": [
                              {"id": f"c{turn}", "type": "function",
                               "function": {"name": "bash", "arguments": "{}"}}]}, "tool_calls")
        messages = [{"role": "system", "content": SYSTEM}] + [
            {"role": "tool", "content": TOOL_RESULT}] * (2 * turn + 1)
        info = {"dialect": "chat", "n_tools": 10, "hint": "x" * 400, "sampling": {},
                "request": {"tools": [t["function"]["name"] for t in TOOLS]},
                "response": {"message": capture.message}, "_messages": messages}
        session.record_ok(f"bench:{turn}", capture, info)
        prompt = prompt + completion.tolist() + list(range(9000, 9230))
    live = (tracemalloc.get_traced_memory()[0] - before) / 1e6
    tracemalloc.stop()
    started = time.process_time()
    body = trace_json(session)
    build = time.process_time() - started
    print(f"  history {len(prompt)} ids; live session {live:.1f} MB (Python heap, tracemalloc); "
          f"export built in {1000 * build:.0f} ms CPU ({len(body) / 1e6:.1f} MB of JSON)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-openenv", action="store_true")
    parser.add_argument("--in-process-only", action="store_true")
    parser.add_argument("--ttfb-only", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    in_process(40 if args.quick else 150)
    if args.in_process_only:
        return
    turns = 4 if args.quick else 8
    long_turns = 40 if args.quick else 150
    with_openenv = not (args.quick or args.no_openenv)
    processes: list[subprocess.Popen] = []
    tmp = Path(tempfile.mkdtemp(prefix="capture-bench-"))
    try:
        fake_port, slow_port = free_port(), free_port()
        processes.append(spawn([PY, "-m", "capture.fake_engine", "--port", str(fake_port)],
                                f"http://127.0.0.1:{fake_port}/health"))
        processes.append(spawn([PY, "-m", "capture.fake_engine", "--port", str(slow_port),
                                 "--token-delay-ms", "5", "--reply-tokens", "150"],
                                f"http://127.0.0.1:{slow_port}/health"))
        fake, slow = f"http://127.0.0.1:{fake_port}", f"http://127.0.0.1:{slow_port}"

        def ours(engine: str, name: str) -> Target:
            port = free_port()
            key_file = tmp / f"{name}.key"
            process = spawn([PY, "-m", "capture", "--engine-url", engine, "--port", str(port),
                              "--admin-key-file", str(key_file), "--log-level", "WARNING"],
                             f"http://127.0.0.1:{port}/health")
            processes.append(process)
            return Target("ours", f"http://127.0.0.1:{port}", process.pid, "ours",
                          key_file.read_text().strip())

        def openenv(engine: str) -> Target:
            port = free_port()
            process = spawn([PY, "-m", "openenv.core.harness.capture.server", "--llm-url",
                              engine, "--model", "fake", "--port", str(port),
                              "--capture-level", "tokens", "--max-output-tokens", "0"],
                             f"http://127.0.0.1:{port}/health")
            processes.append(process)
            return Target("openenv", f"http://127.0.0.1:{port}", process.pid, "openenv")

        direct = Target("direct", fake, None, "direct")
        relay_port = free_port()
        processes.append(spawn([PY, "bench/capture/relay.py", "--engine-url", fake, "--port",
                                 str(relay_port)], f"http://127.0.0.1:{relay_port}/health"))
        relay = Target("relay", f"http://127.0.0.1:{relay_port}/s/relay", processes[-1].pid,
                       "direct")
        targets = [direct, ours(fake, "ours")]
        if with_openenv:
            targets.append(openenv(fake))
        slow_targets = [Target("direct", slow, None, "direct"), ours(slow, "ours-slow")]
        if with_openenv:
            slow_targets.append(openenv(slow))

        async def run() -> None:
            if args.ttfb_only:
                await ttfb(slow_targets)
                return
            await concurrency(targets, turns)
            for target in targets[1:]:
                await single_sessions(target, direct, relay, 4 if args.quick else 10, 15)
            for target in targets[1:]:
                await long_session(target, direct, relay, long_turns, processes[0].pid)
            await ttfb(slow_targets)

        asyncio.run(run())
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)


if __name__ == "__main__":
    main()
