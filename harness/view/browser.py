"""Headless Chromium through Playwright: what a person would see on the viewer's pages.

Used by the browser test (tests/test_view_browser.py), the load benchmark (bench/view/bench.py)
and `python -m harness.view RUN --screenshots DIR`. Playwright (the `playwright` pip package, its
async API) is a maintained driver for Chromium's DevTools protocol, so this module keeps none of
the protocol itself. It drives Debian's Chromium (`apt-get install chromium`; the binary behind
the /usr/bin/chromium shell wrapper, /usr/lib/chromium/chromium) through `chromium.launch(
executable_path=...)`: nothing downloads a browser, and `playwright install` is never run (the
wheel's own Node driver is all it brings). Chromium's `--dump-dom` cannot wait for the page's own
requests, which is why a driver is used at all.

    async with Browser() as browser:
        page = await browser.new_page()
        await page.goto(url)  # waits for the viewer's <main data-state="ready">
        text = await page.eval("document.body.innerText")
        png = await page.screenshot()

Every wait has a deadline and says what it waited for when it runs out.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["Browser", "BrowserError", "Page", "chromium_path", "screenshot_views"]

FLAGS = ["--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         "--hide-scrollbars", "--mute-audio"]
# Debian's /usr/bin/chromium is a shell script that execs this binary with its own flags.
DEBIAN_BINARY = "/usr/lib/chromium/chromium"
READY = "document.querySelector('main') && document.querySelector('main').dataset.state"
VIEWER_READY = f"({READY}) === 'ready' || ({READY}) === 'error' ? ({READY}) : false"


class BrowserError(RuntimeError):
    pass


def chromium_path() -> str | None:
    """The Chromium binary: $CHROMIUM, else Debian's, else chromium / chromium-browser on PATH."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    if os.access(DEBIAN_BINARY, os.X_OK):
        return DEBIAN_BINARY
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


class Browser:
    def __init__(self, executable: str | None = None, *, start_timeout_s: float = 60.0):
        self.executable = executable or chromium_path()
        if self.executable is None:
            raise BrowserError("no Chromium found: install Debian's package (apt-get install -y "
                               "chromium) or set CHROMIUM=/path/to/chromium")
        self.start_timeout_s = start_timeout_s
        self._playwright: Any = None
        self._browser: Any = None

    async def __aenter__(self) -> Browser:
        from playwright.async_api import Error, async_playwright

        self._playwright = await async_playwright().start()
        try:
            self._browser = await self._playwright.chromium.launch(
                executable_path=self.executable, headless=True, chromium_sandbox=False,
                args=FLAGS, timeout=_td(self.start_timeout_s))
        except Error as exc:
            await self._stop()
            raise BrowserError(f"Chromium ({self.executable}) did not start within "
                               f"{self.start_timeout_s:.0f} s: {exc.message}") from exc
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    async def _stop(self) -> None:
        if self._browser is not None:
            await self._browser.close()
            self._browser = None
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None

    async def new_page(self, width: int = 1400, height: int = 1000) -> Page:
        return Page(await self._browser.new_page(viewport={"width": width, "height": height},
                                                 device_scale_factor=1))


class Page:
    def __init__(self, page: Any):
        self.page = page  # playwright.async_api.Page
        size = page.viewport_size or {"width": 1400, "height": 1000}
        self.width, self.height = size["width"], size["height"]

    async def viewport(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        await self.page.set_viewport_size({"width": width, "height": height})

    async def eval(self, expression: str, *, timeout_s: float = 60.0) -> Any:
        """The value of a JavaScript expression (a promise is awaited, up to `timeout_s`)."""
        from playwright.async_api import Error

        try:
            return await asyncio.wait_for(self.page.evaluate(expression), timeout_s)
        except TimeoutError as exc:
            raise BrowserError(f"waited {timeout_s:.0f} s for page script {expression[:120]}"
                               ) from exc
        except Error as exc:
            raise BrowserError(f"page script failed: {expression[:120]}: {exc.message}") from exc

    async def wait_for(self, expression: str, *, what: str, timeout_s: float = 30.0) -> Any:
        """Poll `expression` until truthy; BrowserError naming `what` when the deadline passes."""
        from playwright.async_api import Error
        from playwright.async_api import TimeoutError as PlaywrightTimeout

        try:
            handle = await self.page.wait_for_function(expression, polling=50,
                                                       timeout=_td(timeout_s))
        except PlaywrightTimeout as exc:
            state = await self.eval(f"({READY}) + ' | ' + document.body.innerText.slice(0, 300)")
            raise BrowserError(f"waited {timeout_s:.0f} s for {what}; the page shows: {state}"
                               ) from exc
        except Error as exc:
            raise BrowserError(f"waiting for {what}: {expression[:120]}: {exc.message}") from exc
        return await handle.json_value()

    async def goto(self, url: str, *, ready: str | None = None, timeout_s: float = 30.0) -> float:
        """Open `url` and wait until `ready` (a JavaScript expression; by default the viewer's
        <main data-state> says "ready" or "error") is truthy; returns the seconds it took."""
        from playwright.async_api import Error

        # A hash change is a same-document navigation: mark the old view first so the wait
        # below cannot see the previous view's "ready".
        await self.eval(f"({READY}) ? (document.querySelector('main').dataset.state = "
                        "'navigating') : null")
        t0 = time.perf_counter()
        try:
            await self.page.goto(url, wait_until="commit", timeout=_td(timeout_s))
        except Error as exc:
            raise BrowserError(f"could not open {url} within {timeout_s:.0f} s: {exc.message}"
                               ) from exc
        left = max(timeout_s - (time.perf_counter() - t0), 1.0)
        state = await self.wait_for(ready or VIEWER_READY,
                                    what=f"the page {url} to be ready", timeout_s=left)
        if ready is None and state == "error":
            text = await self.eval("document.querySelector('main').innerText")
            raise BrowserError(f"the viewer page {url} shows an error: {text}")
        return time.perf_counter() - t0

    async def screenshot(self, path: Path | None = None, *, full_page: bool = True,
                         max_height: int = 12000, timeout_s: float = 60.0) -> bytes:
        """A PNG of the page (the whole page, up to `max_height` pixels, when `full_page`)."""
        from playwright.async_api import Error

        clip = None
        if full_page:
            size = await self.eval("[document.documentElement.scrollWidth, "
                                   "document.documentElement.scrollHeight]")
            clip = {"x": 0, "y": 0, "width": max(size[0], self.width),
                    "height": min(max(size[1], self.height), max_height)}
        try:
            png = await self.page.screenshot(type="png", full_page=full_page, clip=clip,
                                             timeout=_td(timeout_s))
        except Error as exc:
            raise BrowserError(f"no screenshot of {self.page.url} within {timeout_s:.0f} s: "
                               f"{exc.message}") from exc
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)
        return png


VIEWS = (("run", "#/run"), ("rollouts", "#/rollouts"))


def screenshot_views(url: str, out_dir: Path, run: Any, *, compare: bool = False,
                     rollout: int | None = None, max_height: int = 2400) -> list[Path]:
    """One PNG per view of the viewer at `url`: the run, the rollouts, one rollout (a trained one
    with the most turns unless given), and before/after when the viewer compares two runs; each
    cut at `max_height` pixels (a long rollout's page runs to tens of thousands)."""
    rows = run.rollouts()
    if rollout is None and rows:
        rollout = _richest(run, rows)
    views = list(VIEWS)
    if rollout is not None:
        views.append(("rollout", f"#/rollout/{rollout}"))
    if compare:
        views.append(("compare", "#/compare"))

    async def shoot() -> list[Path]:
        paths = []
        async with Browser() as browser:
            page = await browser.new_page()
            for name, fragment in views:
                await page.goto(url + fragment)
                await asyncio.sleep(0.3)  # let uPlot finish its first paint (requestAnimationFrame)
                path = Path(out_dir) / f"view-{name}.png"
                await page.screenshot(path, max_height=max_height)
                paths.append(path)
        return paths

    return asyncio.run(shoot())


def _richest(run: Any, rows: list[dict[str, Any]]) -> int:
    """A trained rollout with a reply, preferring the most engine turns (cheap: first 50 ok)."""
    best, best_key = rows[0]["index"], (-1, -1)
    for row in rows[:50]:
        try:
            r = run.rollout(row["index"])
        except (KeyError, FileNotFoundError):
            continue
        key = (int(r.get("trained") is not None and r["trained"].get("advantage") is not None),
               len(r["turns"]))
        if key > best_key:
            best, best_key = row["index"], key
    return best
