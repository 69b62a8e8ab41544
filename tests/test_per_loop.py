"""`harness.shared.per_loop.PerLoop`: one object per running event loop, shared by the service's
factory and proxy link and the trainer's rollout client.

Run: .venv/bin/python -m pytest tests/test_per_loop.py -q   (under a second)
"""

from __future__ import annotations

import asyncio
import itertools

from harness.shared.per_loop import PerLoop


def _counter() -> PerLoop[int]:
    count = itertools.count()
    return PerLoop(lambda: next(count))


def test_each_loop_gets_its_own_object_made_once() -> None:
    per_loop = _counter()

    async def twice() -> tuple[int, int]:
        return per_loop.get(), per_loop.get()

    first = asyncio.run(twice())
    second = asyncio.run(twice())
    assert first == (0, 0) and second == (1, 1)


def test_an_unusable_object_is_replaced() -> None:
    closed: set[int] = set()
    count = itertools.count()
    per_loop = PerLoop(lambda: next(count), usable=lambda n: n not in closed)

    async def run() -> list[int]:
        got = [per_loop.get()]
        closed.add(got[0])
        return [*got, per_loop.get(), per_loop.get()]

    assert asyncio.run(run()) == [0, 1, 1]


def test_pop_forgets_the_running_loops_object_only() -> None:
    per_loop = _counter()
    other = asyncio.new_event_loop()
    try:
        async def made() -> int:
            return per_loop.get()

        kept = other.run_until_complete(made())

        async def pop_then_get() -> tuple[int | None, int | None, int]:
            return per_loop.pop(), per_loop.pop(), per_loop.get()

        assert asyncio.run(pop_then_get()) == (None, None, kept + 1)
        assert other.run_until_complete(made()) == kept  # a live loop keeps its object
    finally:
        other.close()


def test_closed_loops_are_dropped_and_live_ones_kept() -> None:
    per_loop = _counter()
    live = asyncio.new_event_loop()
    try:
        async def made() -> int:
            return per_loop.get()

        on_live = live.run_until_complete(made())
        asyncio.run(made())  # a short loop, closed when it returns
        asyncio.run(made())  # making this one drops the closed loop's entry
        assert len(per_loop._entries) == 2
        assert live.run_until_complete(made()) == on_live
    finally:
        live.close()
