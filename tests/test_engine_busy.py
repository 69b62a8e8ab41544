"""The engine-busy fraction: a proxy's busy clock per engine, and the union over services.

Run: .venv/bin/python -m pytest tests/test_engine_busy.py -q

Scripted intervals on a fake clock (capture.busy, harness.client.engine_busy); the fraction in
a real run's summary.json is checked by tests/test_multi_host.py.
"""

from __future__ import annotations

import pytest

from capture.busy import BusyClock
from harness.client.engine_busy import engine_busy, union_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_calls_make_one_busy_interval_and_idle_time_is_not_counted():
    clock = FakeClock()
    busy = BusyClock(clock)
    busy.begin()            # 100: call 1
    clock.now = 102
    busy.begin()            # 102: call 2 while 1 is in flight
    clock.now = 103
    busy.end()              # 103: call 1 done, 2 still in flight: still busy
    clock.now = 105
    busy.end()              # 105: idle -> one interval [100, 105]
    clock.now = 110
    busy.begin()            # 110: call 3, still open at 111
    clock.now = 111
    report = busy.report()
    assert report["intervals"] == [[100, 105], [110, 111]]
    assert report["busy_s"] == pytest.approx(5 + 1)
    assert (report["calls"], report["in_flight"]) == (3, 1)


def test_an_unmatched_end_never_makes_the_count_negative():
    busy = BusyClock(FakeClock())
    busy.end()
    assert busy.report()["in_flight"] == 0 and busy.report()["intervals"] == []


def test_a_full_clock_keeps_its_latest_intervals_and_says_since_when_they_are_complete():
    clock = FakeClock()
    busy = BusyClock(clock, keep=2)
    for start in (100, 110, 120):  # three 1 s calls; only two kept
        clock.now = start
        busy.begin()
        clock.now = start + 1
        busy.end()
    report = busy.report()
    assert report["intervals"] == [[110, 111], [120, 121]]
    assert report["complete_since"] == 101  # the end of the interval dropped


def test_union_counts_overlaps_once_and_clips_to_the_window():
    # window [10, 20]: [5, 12] -> 2 s, [11, 14] overlaps -> +2 s (12..14), [18, 30] -> 2 s,
    # [25, 26] outside -> 0: 6 s
    assert union_s([[5, 12], [11, 14], [18, 30], [25, 26]], 10, 20) == pytest.approx(6)
    assert union_s([], 0, 10) == 0


def _service(url_busy: dict[str, list[list[float]]], since: float = 0.0) -> dict:
    return {"engines": [{"url": url, "busy": {"calls": len(iv), "intervals": iv,
                                              "complete_since": since}}
                        for url, iv in url_busy.items()]}


def test_two_services_on_one_engine_count_the_union_of_their_busy_time():
    # Training window [0, 10]. Engine A: service 1 busy [0, 4], service 2 busy [2, 6] -> the
    # engine was busy [0, 6]: 0.6 (each service alone saw 0.4). Engine B: [8, 10] -> 0.2.
    metrics = {"http://s1": _service({"http://a": [[0, 4]], "http://b": []}),
               "http://s2": _service({"http://a": [[2, 6]], "http://b": [[8, 10]]})}
    result = engine_busy(metrics, 0.0, 10.0)
    a, b = result["engines"]["http://a"], result["engines"]["http://b"]
    assert a["busy_fraction"] == pytest.approx(0.6)
    assert a["by_service"] == {"http://s1": pytest.approx(0.4), "http://s2": pytest.approx(0.4)}
    assert b["busy_fraction"] == pytest.approx(0.2) and b["calls"] == 1
    assert result["mean_busy_fraction"] == pytest.approx(0.4)


def test_a_proxy_whose_intervals_start_late_moves_the_window_start():
    # service 1's intervals are complete from 5 only: window [5, 10], busy [5, 7] -> 0.4
    metrics = {"http://s1": _service({"http://a": [[5, 7]]}, since=5.0)}
    engine = engine_busy(metrics, 0.0, 10.0)["engines"]["http://a"]
    assert engine["window_start"] == 5.0 and engine["busy_fraction"] == pytest.approx(0.4)


def test_the_engine_client_counts_whole_and_streamed_calls_until_their_end():
    # Against the fake engine: a whole reply is busy until it is read, a stream until it is
    # released, and a refused call ends at once; nothing stays in flight afterwards.
    import asyncio
    import socket

    import orjson

    from capture.errors import EngineUnreachable
    from capture.fake_engine import FakeEngine
    from capture.upstream import EngineClient

    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}

    async def run() -> None:
        with FakeEngine() as fake:
            engine = EngineClient(fake.url)
            await engine.complete(orjson.dumps(chat))
            assert engine.busy.in_flight == 0
            stream = await engine.open_stream(orjson.dumps({**chat, "stream": True}))
            assert engine.busy.in_flight == 1  # open until released
            _ = [c async for batch in stream.batches() for c in batch]
            await stream.aclose()
            await stream.aclose()  # a second release ends nothing more
            report = engine.busy.report()
            assert (report["calls"], report["in_flight"]) == (2, 0)
            assert len(report["intervals"]) == 2 and report["busy_s"] > 0
            await engine.aclose()
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        gone = EngineClient(f"http://127.0.0.1:{port}")
        with pytest.raises(EngineUnreachable):
            await gone.open_stream(orjson.dumps({**chat, "stream": True}))
        assert (gone.busy.calls, gone.busy.in_flight) == (1, 0)
        await gone.aclose()

    asyncio.run(run())
